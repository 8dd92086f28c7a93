"""The dashboard (runs, live ones updating, totals, venue health) and the venues page
(each worker's recent sub-queries, latency and error history)."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal

from django.test import Client

from tests.conftest import TEST_VENUES
from tests.helpers import finish, launch, local_venue, scripted, stack_worker_ids, trace
from tests.pages.helpers import SLOW_WORKERS, make_user, shot, slow_question, wait_for
from workers.models import Worker


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
    # Its wall time so far, and it grows while the table is polled.
    wall = row.locator("td.wall").inner_text()
    assert wall.split()[0][0].isdigit(), wall
    cell = f"document.querySelector('tr[data-run={live.id}] td.wall').innerText"
    wait_for(page, f"{cell} !== {json.dumps(wall)}", what="the live run's wall time to grow")
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


def test_it_shows_one_workers_page_with_reputation_recent_subqueries_and_history(page, web):
    run = finish(launch(task="sniah", tokens=100_000, seed=4))
    assert run.status == "succeeded", run.error
    events = trace(run)
    mine = [e for e in events if e["name"] == "SubQuery.Execute" and e["phase"] == "end"]
    worker = mine[0]["worker_id"]
    calls = sum(1 for e in mine if e["worker_id"] == worker)
    # The dashboard's health panel: the worker's reputation (its reputation has seen it work)
    # and a link to its page.
    page.goto("/")
    page.wait_for_selector(f"#health tr[data-worker='{worker}']")
    rep = page.inner_text(f"#health tr[data-worker='{worker}'] td.rep")
    assert 0 < float(rep) <= 1, rep
    page.click(f"#health tr[data-worker='{worker}'] a")
    page.wait_for_url(f"{web}/workers/{worker}")
    assert page.inner_text("#worker-state") == "online"
    assert 0 < float(page.inner_text("#worker-reputation .v")) <= 1
    assert "completion" in page.inner_text("#worker-reputation")
    rows = page.locator("#worker-recent tbody tr")
    assert rows.count() == min(calls, 100)
    # The price its receipts charged, and what each reply was paid (a review: the page said
    # the announced $0 / $0 of a worker whose receipts charged its model's list price).
    receipts = [
        e["attrs"]["receipt"]
        for e in events
        if e["name"] == "Receipt.Emit" and e["worker_id"] == worker
    ]
    assert receipts
    charged = receipts[0]["price"]
    facts = page.inner_text("dl.facts")
    assert f"${charged['per_1k_in']} in / ${charged['per_1k_out']} out" in facts, facts
    # As the template's floatformat:6 rounds a Decimal: half up.
    six = Decimal("0.000001")
    paid = {f"${Decimal(r['paid']).quantize(six, rounding=ROUND_HALF_UP)}" for r in receipts}
    shown = [t for t in page.locator("#worker-recent tbody td:nth-child(8)").all_inner_texts()]
    assert any(t != "–" for t in shown) and {t for t in shown if t != "–"} <= paid, shown
    assert page.locator(f"#worker-recent a[href='/runs/{run.id}']").count() == min(calls, 100)
    page.wait_for_selector("#history[data-ready='1'] .main-svg")
    # Its history chart has this worker's series only, under the name it registered.
    registered = Worker.objects.get(id=worker).name
    names = page.evaluate("document.getElementById('history').data.map(t => t.name)")
    assert names and all(name.startswith(registered) for name in names), names
    shot(page, "10-worker")


def test_it_shows_a_worker_only_the_runs_a_user_may_see(web, venues):
    owner, other = make_user("carol"), make_user("dave")
    run = finish(launch(task="sniah", tokens=100_000, seed=4))
    run.owner = owner
    run.save(update_fields=["owner"])
    worker = next(
        e["worker_id"] for e in trace(run) if e["name"] == "SubQuery.Execute" and e["worker_id"]
    )
    as_owner, as_other = Client(), Client()
    as_owner.force_login(owner)
    as_other.force_login(other)
    assert run.id in as_owner.get(f"/workers/{worker}").content.decode()
    page = as_other.get(f"/workers/{worker}")
    assert page.status_code == 200 and run.id not in page.content.decode()
    assert as_other.get("/workers/wnosuchworker").status_code == 404


def test_it_shows_how_each_worker_is_connected_from_where_and_its_round_trip(
    page, web, venues, tmp_path
):
    from tests.gateway import GatewayWorker
    from tests.helpers import wait_until

    far = GatewayWorker(web, "far", "far-page", tmp_path, "--concurrency", "2")
    try:
        far.wait_up()
        wait_until(lambda: (far.entry() or {}).get("rtt_ms") is not None, what="an RTT")
        page.goto("/venues")
        card = page.locator(f".worker-card[data-worker='{far.worker_id}']")
        link = card.locator(".link-gateway").inner_text()
        assert link.startswith("gateway from 127.0.0.1 · RTT ") and link.endswith(" ms"), link
        local = next(iter(stack_worker_ids()))
        assert page.locator(f".worker-card[data-worker='{local}'] .link-broker").count() == 1
        page.goto(f"/workers/{far.worker_id}")
        assert page.inner_text("#worker-link .v") == "gateway"
        assert "from 127.0.0.1 · RTT" in page.inner_text("#worker-link .sub")
        shot(page, "08b-worker-gateway")
    finally:
        far.kill()


def test_the_dashboards_panel_counts_offline_workers_instead_of_listing_them(staff):
    """Each restart leaves a worker seen in recent traces but gone: the panel listed them
    all (27 rows after a review's session); it lists those online and links the rest."""
    from frlm_web.redis_client import get_redis
    from tests.helpers import bare_run, wait_until
    from traces import store
    from traces.emitter import Emitter

    run = bare_run(question="gone", owner=staff, status="succeeded")
    conductor = Emitter(get_redis(), run.id)
    with conductor.span("Run.Init") as root:
        with conductor.span("SubQuery.Submit", parent=root.span_id, venue="local") as sq:
            gone = Emitter(get_redis(), run.id, venue="local", worker_id="wgone0000001")
            with gone.span("SubQuery.Execute", parent=sq.span_id):
                pass
    wait_until(lambda: store.event_count(run.id) >= 6, timeout=20, what="the run stored")
    client = Client()
    client.force_login(staff)
    panel = client.get("/venues/panel").content.decode()
    assert 'data-worker="wgone0000001"' not in panel
    assert "1 offline</a>" in panel
    for worker in stack_worker_ids():
        assert f'data-worker="{worker}"' in panel  # the live ones are listed


def test_a_registered_worker_that_never_connected_reads_consistently(staff):
    """It said "offline" at the top and "status Active" below, with prices spelt to twelve
    places (a review)."""
    from decimal import Decimal

    venue = local_venue()
    idle = Worker.objects.create(
        name="never-came", venue=venue, public_key="k" * 44, price_in=Decimal("0.1")
    )
    client = Client()
    client.force_login(staff)
    page = client.get(f"/workers/{idle.id}").content.decode()
    assert "registered, not deregistered · offline now: no heartbeat" in page
    assert "$0.1 in / $0 out per 1,000 tokens" in page
    assert "0.000000000000" not in page


def test_a_workers_page_prices_each_model_it_serves_as_a_run_pays_it():
    """A run prices a reply at the model the job asked for: a worker serving an unpriced
    model and a priced one showed only the priced one's price (a review)."""
    from decimal import Decimal as D

    from workers.views import _price_shown

    both = _price_shown(Worker(models_served=["my-llama", "frlm-sim-worker"]))
    assert [(p["model"], p["per_1k_in"]) for p in both] == [
        ("my-llama", None),
        ("frlm-sim-worker", "0.00015"),
    ]
    own = _price_shown(Worker(models_served=["my-llama"], price_in=D("0.5"), price_out=D("1")))
    assert own == [{"model": "", "per_1k_in": "0.5", "per_1k_out": "1", "source": ""}]
    (any_model,) = _price_shown(Worker(models_served=[]))
    assert "for a job that asks for it" in any_model["source"]
