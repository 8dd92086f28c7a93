"""The spending budget: reservations before dispatch, settlement after, each cap refusing
with a reason, one alert per cap at 80%, and the fill view's figures."""

from __future__ import annotations

import threading
from decimal import Decimal as D

import pytest

from runs.trust.budget import Budget, BudgetRefused, Caps, Price, estimate_cost
from workers.pricing import cost_of

# $1 per 1,000 tokens in and $2 per 1,000 out: 100 in + 50 out cost $0.20.
PRICE = Price(1.0, 2.0)


def reserve(budget: Budget, subquery: str = "sq1", provider: str = "sim", **kw):
    kw.setdefault("tokens_in", 100)
    kw.setdefault("tokens_out", 50)
    return budget.reserve(subquery=subquery, provider=provider, worker_id="w1", price=PRICE, **kw)


def test_it_estimates_cost_like_the_price_table():
    assert estimate_cost(100, 50, PRICE) == D("0.2")
    assert estimate_cost(1000, 1000, Price(0.00015, 0.0006)) == D("0.00075")
    assert cost_of("frlm-sim-worker", 1000, 1000) == D("0.00075")


def test_it_leaves_nothing_over_when_every_reservation_is_settled():
    # In floats 0.1 + 0.2 reserved and then settled left "reserved": 5.2e-18 behind, and
    # three dispatches of $0.1 passed a $0.3 cap; in Decimals both are exact.
    budget = Budget("r1", Caps(run=D("0.3")))
    held = [reserve(budget, f"sq{n}", tokens_in=n * 100, tokens_out=0) for n in (1, 2)]
    assert budget.fill()["run"]["committed"] == "0.3"
    for h in held:
        budget.settle(h.id, tokens_in=0, tokens_out=0, cost=h.amount)
    fill = budget.fill()["run"]
    assert (fill["reserved"], fill["settled"], fill["committed"]) == ("0", "0.3", "0.3")
    exact = Budget("r2", Caps(run="0.3"))
    for _ in range(3):
        reserve(exact, "sq", tokens_in=100, tokens_out=0)  # $0.1 each: exactly the cap
    assert exact.fill()["run"]["fraction"] == 1.0
    with pytest.raises(BudgetRefused):
        reserve(exact, "sq", tokens_in=1, tokens_out=0)


def test_it_reserves_then_settles_the_actual_cost():
    budget = Budget("r1", Caps(run=10.0))
    held = reserve(budget)
    assert held.amount == D("0.2")
    assert held.attrs["ok"] and held.attrs["reservation"] == held.id
    assert held.attrs["run_committed"] == "0.2"
    assert (held.attrs["price_in"], held.attrs["price_out"]) == ("1", "2")
    fill = budget.fill()["run"]
    assert (fill["reserved"], fill["settled"]) == ("0.2", "0")

    done = budget.settle(held.id, tokens_in=100, tokens_out=20)
    assert done.cost == D("0.14")  # the actual tokens at the reserved price
    assert done.attrs["reserved"] == "0.2"
    assert done.attrs["run_settled"] == "0.14"
    fill = budget.fill()["run"]
    assert (fill["reserved"], fill["settled"], fill["cap"]) == ("0", "0.14", "10")
    assert fill["fraction"] == pytest.approx(0.014)


def test_it_takes_a_known_actual_cost_and_releases_unspent_reservations():
    budget = Budget("r1", Caps())
    first, second = reserve(budget), reserve(budget, "sq2")
    assert budget.settle(first.id, tokens_in=1, tokens_out=1, cost=D("0.5")).cost == D("0.5")
    released = budget.release(second.id)
    assert released.attrs["released"] and released.cost == 0
    assert budget.fill()["run"]["committed"] == "0.5"
    with pytest.raises(ValueError, match="already settled or released"):
        budget.settle(first.id, tokens_in=1, tokens_out=1)


def test_it_refuses_past_the_run_cap_with_a_reason():
    budget = Budget("r1", Caps(run=0.5))
    reserve(budget)
    reserve(budget, "sq2")
    with pytest.raises(BudgetRefused) as refused:
        reserve(budget, "sq3")
    assert refused.value.scope == "run"
    assert refused.value.attrs["ok"] is False
    assert refused.value.attrs["refused_by"] == "run"
    assert "budget cap of the run reached" in str(refused.value)
    assert "$0.400000 of $0.500000" in str(refused.value)
    assert budget.fill()["refused"] == 1
    # A smaller dispatch still fits.
    assert reserve(budget, "sq3", tokens_in=100, tokens_out=0).amount == D("0.1")


def test_it_refuses_past_the_sub_query_cap_over_all_its_replicas():
    budget = Budget("r1", Caps(subquery=0.45))
    reserve(budget, "sq1")
    reserve(budget, "sq1")
    with pytest.raises(BudgetRefused) as refused:
        reserve(budget, "sq1")  # a third replica of the same sub-query
    assert (refused.value.scope, refused.value.key) == ("subquery", "sq1")
    assert "sub-query sq1" in str(refused.value)
    reserve(budget, "sq2")  # another sub-query has its own cap


def test_it_refuses_past_a_provider_cap_and_leaves_other_providers_alone():
    budget = Budget("r1", Caps(providers={"openai:gpt-4.1": 0.3}))
    reserve(budget, provider="openai:gpt-4.1")
    with pytest.raises(BudgetRefused) as refused:
        reserve(budget, provider="openai:gpt-4.1")
    assert refused.value.scope == "provider"
    assert "provider openai:gpt-4.1" in str(refused.value)
    reserve(budget, provider="sim")
    providers = {p["key"]: p for p in budget.fill()["providers"]}
    assert providers["openai:gpt-4.1"]["cap"] == "0.3"
    assert providers["sim"]["cap"] is None


def test_it_names_the_run_cap_first_when_several_are_reached():
    budget = Budget("r1", Caps(run=0.2, subquery=0.2))
    reserve(budget)
    with pytest.raises(BudgetRefused) as refused:
        reserve(budget)
    assert refused.value.scope == "run"


def test_it_pays_a_worker_no_more_than_the_caps_leave_and_refuses_what_comes_next():
    """A worker's reply that overruns its reservation is paid what the caps have left, and
    says what it asked; the root's own turn (no sub-query) is the conductor's model call,
    whose money is gone: it passes the cap. Either way the next reservation is refused."""
    budget = Budget("r1", Caps(run=1.0, subquery=0.9))
    held = reserve(budget)
    settled = budget.settle(held.id, tokens_in=0, tokens_out=0, cost=1.2)  # it overran
    assert settled.cost == D("0.9") and settled.attrs["claimed"] == "1.2"
    assert budget.fill()["run"]["fraction"] == pytest.approx(0.9)
    with pytest.raises(BudgetRefused):
        reserve(budget, tokens_in=1, tokens_out=0)
    root = Budget("r2", Caps(run=1.0))
    turn = reserve(root, "", tokens_in=1, tokens_out=1)
    assert root.settle(turn.id, tokens_in=0, tokens_out=0, cost=1.2).cost == D("1.2")
    assert root.fill()["run"]["fraction"] == pytest.approx(1.2)
    with pytest.raises(BudgetRefused):
        reserve(root, tokens_in=1, tokens_out=0)


def test_it_alerts_once_per_cap_when_committed_spending_crosses_80_percent():
    budget = Budget("r1", Caps(run=1.0, subquery=0.5))
    first = reserve(budget)  # run 0.2, sq1 0.2
    assert first.alerts == []
    second = reserve(budget)  # run 0.4, sq1 0.4: sq1 crosses 80% of 0.5
    assert [(a["scope"], a["key"]) for a in second.alerts] == [("subquery", "sq1")]
    assert second.alerts[0]["fraction"] == pytest.approx(0.8)
    assert reserve(budget, "sq2").alerts == []  # run 0.6
    settle = budget.settle(first.id, tokens_in=0, tokens_out=0, cost=0.45)  # run 0.85
    assert [(a["scope"], a["key"], a["threshold"]) for a in settle.alerts] == [("run", "r1", 0.8)]
    later = reserve(budget, "sq3", tokens_in=100, tokens_out=0)  # run 0.95: no second alert
    assert later.alerts == []
    assert [a["scope"] for a in budget.fill()["alerts"]] == ["subquery", "run"]


def test_it_keeps_the_books_straight_under_concurrent_threads():
    budget = Budget("r1", Caps(run=100.0))
    refused: list[BudgetRefused] = []

    def work(n: int) -> None:
        for i in range(200):
            try:
                held = reserve(budget, f"sq{n}-{i}")
            except BudgetRefused as exc:
                refused.append(exc)
                continue
            budget.settle(held.id, tokens_in=100, tokens_out=50)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run = budget.fill()["run"]
    # 1,600 dispatches of $0.20 against $100: exactly 500 fit, the rest are refused.
    assert len(refused) == 1100
    assert (run["settled"], run["reserved"]) == ("100", "0")


def test_it_shows_the_busiest_sub_queries_in_the_fill_view():
    budget = Budget("r1", Caps(subquery=1.0))
    for name, times in (("a", 1), ("b", 3), ("c", 2)):
        for _ in range(times):
            reserve(budget, name)
    rows = budget.fill(top=2)["subqueries"]
    assert [(r["key"], r["cap"]) for r in rows] == [("b", "1"), ("c", "1")]
    assert rows[0]["committed"] == "0.6"


def test_it_rejects_bad_caps_and_estimates():
    with pytest.raises(ValueError, match="run cap -1"):
        Caps(run=-1)
    with pytest.raises(ValueError, match="0 or more"):
        reserve(Budget("r1", Caps()), tokens_in=-5)


def test_it_holds_a_root_turn_to_the_run_cap_but_not_to_the_sub_query_cap():
    budget = Budget("r1", Caps(run=0.5, subquery=0.1))
    root = reserve(budget, subquery="")  # $0.20, above the sub-query cap
    budget.settle(root.id, tokens_in=100, tokens_out=50)
    with pytest.raises(BudgetRefused) as refused:
        reserve(budget, subquery="sq1")
    assert refused.value.scope == "subquery"
    fill = budget.fill()
    assert fill["run"]["settled"] == "0.2"
    assert "" not in [s["key"] for s in fill["subqueries"]]  # root turns are not sub-queries
