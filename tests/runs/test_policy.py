from __future__ import annotations

from decimal import Decimal

import pytest

from runs.engine.policy import Policy, PolicyError, parse_assignments, provider_caps


def test_it_defaults_when_nothing_is_given():
    assert Policy.from_dict(None) == Policy()


def test_it_converts_command_line_strings():
    policy = Policy.from_dict({"quorum": "0.9", "max_turns": "4"})
    assert policy.quorum == 0.9
    assert policy.max_turns == 4


def test_it_names_every_bad_value_at_once():
    with pytest.raises(PolicyError) as err:
        Policy.from_dict({"quorum": 2, "max_turns": "many", "speed": 1})
    message = str(err.value)
    assert "policy.quorum must be between 0.05 and 1.0, got 2" in message
    assert "policy.max_turns must be an integer" in message
    assert "policy.speed is not a policy setting" in message


def test_it_rejects_a_fractional_integer_setting():
    with pytest.raises(PolicyError, match="max_depth"):
        Policy.from_dict({"max_depth": "1.5"})


def test_it_parses_assignments():
    assert parse_assignments(["quorum=0.5", "policy.max_depth=2"]) == {
        "quorum": "0.5",
        "max_depth": "2",
    }
    with pytest.raises(PolicyError, match="KEY=VALUE"):
        parse_assignments(["quorum"])
    # The last one won without a word (a review: an experiment's loop lost values).
    with pytest.raises(PolicyError, match=r"quorum is given twice \(quorum=0.5 and quorum=1\)"):
        parse_assignments(["quorum=0.5", "policy.quorum=1"])


def test_it_takes_the_trust_and_budget_settings_and_says_what_a_bad_one_needs():
    policy = Policy.from_dict(
        {
            "tier": "high_trust",
            "hedge": "p99",
            "budget_usd": "2.5",
            "provider_budgets": "gpt-4.1-mini=1.5,frlm-sim-worker=0.2",
        }
    )
    assert (policy.tier, policy.hedge, policy.budget_usd) == ("high_trust", "p99", 2.5)
    assert provider_caps(policy.provider_budgets) == {
        "gpt-4.1-mini": Decimal("1.5"),
        "frlm-sim-worker": Decimal("0.2"),
    }
    with pytest.raises(PolicyError) as caught:
        Policy.from_dict({"hedge": "p50", "provider_budgets": "gpt=lots", "budget_usd": -1})
    message = str(caught.value)
    assert "policy.hedge must be one of off, p90, p95, p99" in message
    assert "policy.provider_budgets must be MODEL=DOLLARS pairs" in message
    assert "policy.budget_usd must be between 0.0 and 1000000.0" in message
