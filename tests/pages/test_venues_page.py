"""The dashboard (runs, live ones updating, totals, venue health) and the venues page
(each worker's recent sub-queries, latency and error history)."""

from __future__ import annotations

from tests.conftest import TEST_VENUES
from tests.helpers import finish, launch, scripted, stack_worker_ids, trace
from tests.pages.conftest import shot
from tests.pages.helpers import SLOW_WORKERS, slow_question


def test_it_lists_runs_live_and_finished_with_totals_and_health(page, web):
    live = launch(question=slow_question(ticks=12), worker_sim=SLOW_WORKERS)
    done = finish(launch(task="sniah", tokens=100_000, seed=4))
    failed = finish(launch(question=scripted("1/0"), policy={"max_errors": 0}))
    assert done.status == "succeeded" and failed.status == "failed", failed.error
    page.goto("/")
    page.wait_for_selector("#health .venue")
    row = page.locator(f"tr[data-run={live.id}]")
    assert "is-live" in row.get_attribute("class")
    assert row.locator(".dot").count() == 1
    assert page.locator(f"tr[data-run={failed.id}] .st-failed").count() == 1
    assert page.locator(f"tr[data-run={done.id}] .ok").count() == 1  # the answer checks out
    assert page.inner_text(".totals .stat:nth-child(1) .v") == "3"
    ids = stack_worker_ids()
    assert len(ids) == len(TEST_VENUES)
    for worker in ids:
        row = page.locator(f"#health tr[data-worker={worker}]")
        assert row.count() == 1 and row.locator(".health.down").count() == 0
    shot(page, "02-dashboard")
    finish(live)
    # htmx polls the table: the live run turns into a finished one without a reload.
    page.wait_for_selector(f"tr[data-run={live.id}] .st-succeeded", timeout=10_000)
    assert page.locator("tr.is-live").count() == 0


def test_it_shows_each_workers_recent_subqueries_and_history(page, web):
    run = finish(launch(task="sniah", tokens=100_000, seed=4))
    events = trace(run)
    workers = {e["worker_id"] for e in events if e["name"] == "SubQuery.Execute" and e["worker_id"]}
    page.goto("/venues")
    page.wait_for_selector("#history[data-ready='1']")
    for worker in workers:
        card = page.locator(f".worker-card[data-worker='{worker}']")
        assert card.is_visible()
        assert card.locator(".health.up, .health.busy").count() == 1
        assert card.locator(f"a[href='/runs/{run.id}']").count() >= 1
    assert page.locator("#history .main-svg").count() >= 1
    shot(page, "08-venues")
