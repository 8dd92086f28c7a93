"""Money as exact decimals (frlm_web/money.py) and the prices behind it (workers/pricing.py)."""

from __future__ import annotations

import json
from decimal import Decimal as D

import pytest

from frlm_web.money import cost_at, is_money_str, money, money_str
from runs.models import Run
from workers import pricing


@pytest.fixture
def prices(monkeypatch):
    """Set FRLM_PRICES for one test (the parsed table and lookups are cached)."""

    def set_(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("FRLM_PRICES", raising=False)
        else:
            monkeypatch.setenv("FRLM_PRICES", value)
        pricing.overrides.cache_clear()

    yield set_
    monkeypatch.delenv("FRLM_PRICES", raising=False)
    pricing.overrides.cache_clear()


def test_it_spells_amounts_one_way_without_exponents():
    assert money_str(D("7.5E-7")) == "0.00000075"
    assert money_str(D("100.000")) == "100" and money_str(D("0E-12")) == "0"
    assert [is_money_str(v) for v in ("0.1", "0", "0.10", "1e-3", "-1", 0.1)] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]


def test_it_reads_floats_by_their_shortest_spelling_and_refuses_the_rest():
    assert money(0.1) == D("0.1") and money("0.00015") == D("0.00015") and money(3) == 3
    for bad in (float("nan"), float("inf"), -0.5, "cheap", True, None, [1]):
        with pytest.raises(ValueError):
            money(bad, what="the price")


def test_it_costs_tokens_exactly():
    # In floats three times 100 tokens at $1 per 1,000 is 0.30000000000000004.
    one = cost_at(D("1"), D("0"), 100, 0)
    assert one + one + one == D("0.3")
    assert cost_at(D("0.00015"), D("0.0006"), 1, 1) == D("0.00000075")


def test_it_prices_the_simulated_models_from_its_dated_table(prices):
    prices(None)
    root = pricing.model_price("frlm-sim-root")
    assert (root.per_1k_in, root.per_1k_out) == (D("0.0025"), D("0.01"))
    assert root.source == f"FRLM's table of {pricing.TABLE_DATE}"
    assert pricing.cost_of("frlm-sim-worker", 1000, 1000) == D("0.00075")


def test_it_prices_a_known_model_from_genai_prices(prices):
    prices(None)
    price = pricing.model_price("claude-sonnet-4-5")  # in no table of FRLM's
    assert price is not None and price.source.startswith("genai-prices ")
    assert price.per_1k_in > 0 and isinstance(price.per_1k_in, D)


def test_it_has_no_price_for_a_model_nobody_knows(prices):
    prices(None)
    assert pricing.model_price("my-own-llama-7b") is None
    assert pricing.cost_of("my-own-llama-7b", 10, 10) is None
    assert "set FRLM_PRICES" in pricing.price_source("my-own-llama-7b")


def test_it_takes_frlm_prices_inline_or_from_a_file_before_any_list(prices, tmp_path):
    prices('{"my-own-llama-7b": ["0.0001", 0.0002], "gpt-4o": {"in": "1", "out": "2"}}')
    assert pricing.model_price("my-own-llama-7b")[:2] == (D("0.0001"), D("0.0002"))
    assert pricing.model_price("gpt-4o") == (D("1"), D("2"), "FRLM_PRICES")
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"frlm-sim-root": ["0", "0"]}))
    prices(str(path))
    assert pricing.cost_of("frlm-sim-root", 1000, 1000) == 0


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{not json", "FRLM_PRICES is not valid JSON"),
        ("/no/such/prices.json", "neither inline JSON nor a readable file"),
        ('["gpt-4o"]', "must be a JSON object"),
        ('{"m": [1]}', "FRLM_PRICES['m'] must be [in, out]"),
        ('{"m": [-1, 1]}', "FRLM_PRICES['m'] in must be 0 or more dollars"),
    ],
)
def test_it_refuses_a_malformed_frlm_prices_in_one_line(prices, value, says):
    prices(value)
    with pytest.raises(ValueError, match=r".*") as refused:
        pricing.model_price("gpt-4o")
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.django_db
def test_it_stores_a_run_cost_exactly():
    for n, cost in enumerate(("0.000000750001", "123.456789012345", "0")):
        Run.objects.create(
            id=f"rMoney{n}",
            question="q",
            context_source=Run.Source.TEXT,
            root_model={},
            worker_model={},
            cost=D(cost),
        )
        assert Run.objects.get(id=f"rMoney{n}").cost == D(cost)
