from __future__ import annotations

import pytest

from runs.policy import Policy, PolicyError, parse_assignments


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
