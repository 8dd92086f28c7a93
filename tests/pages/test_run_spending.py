"""The run page's spending and trust figures: the fill view's budget against the run's cap
(from Budget.* events), and the summary strip's receipts and verification share (from
Receipt.Emit and Verify.* events). The events are made by hand and go the product's way:
the real emitter, the stack's recorder, the page.

"""

from __future__ import annotations

from frlm_web.redis_client import get_redis
from runs.models import Run
from tests.helpers import wait_until
from tests.pages.helpers import shot, wait_for
from traces import store
from traces.emitter import Emitter

HOSTILE_VERDICT = "<script>window.__pwned = 1</script>"


def a_run(owner, question: str) -> Run:
    return Run.objects.create(
        question=question,
        context_source="text",
        context_path="/dev/null",
        root_model={"kind": "sim", "model": "sim", "base_url": ""},
        worker_model={"kind": "sim", "model": "sim", "base_url": ""},
        owner=owner,
        status="succeeded",
        answer="42",
    )


def receipt(run_id: str, span: str, worker: str, cost: float, verdict: str, seq: int) -> dict:
    """The attrs of a Receipt.Emit event, shaped as runs.trust.receipts.ReceiptAttrs."""
    body = {
        "run": run_id,
        "span": span,
        "attempt": f"{seq}.1",
        "worker": worker,
        "input_sha256": "0" * 64,
        "output_sha256": "1" * 64,
        "tokens_in": 100,
        "tokens_out": 10,
        "price": {"per_1k_in": 1.0, "per_1k_out": 1.0},
        "cost": cost,
        # As runs.trust.receipts pays: the cost, unless the reply was judged wrong.
        "paid": cost if verdict in ("accepted", "unverified", "validator") else 0.0,
        "verdict": verdict,
        "time": "2026-01-01T00:00:00Z",
        "prev": None,
        "seq": seq,
    }
    return {
        "receipt": body,
        "hash": f"{seq:064x}",
        "worker_sig": "sig",
        "worker_key": "key",
        "conductor_sig": "sig",
        "conductor_key": "key",
    }


def write_run(run: Run, *, budget: bool, cap: float | None = 1.0) -> int:
    """A finished run of four sub-queries; with `budget`, each reserved then settled
    (0.1 each; the fourth stays reserved), an alert at 80%, three receipts (one with a
    verdict that is markup) and two sub-queries verified (one rejected). Returns the
    number of events once stored."""
    client = get_redis()
    conductor = Emitter(client, run.id, venue="conductor")
    events = 0
    with (
        conductor.span("Run.Init") as root,
        conductor.span("Repl.Exec", parent=root.span_id) as cell,
    ):
        committed = settled = 0.0
        for i in range(4):
            worker = f"w{i % 2}"
            with conductor.span("SubQuery.Submit", parent=cell.span_id, venue="local") as sq:
                if budget:
                    committed += 0.1
                    conductor.instant(
                        "Budget.Reserve",
                        parent=sq.span_id,
                        attrs={
                            "reservation": f"res{i}",
                            "subquery": sq.span_id,
                            "provider": "sim",
                            "worker": worker,
                            "amount": 0.1,
                            "ok": True,
                            "refused_by": None,
                            "reason": "",
                            "run_committed": committed,
                            "run_cap": cap,
                        },
                    )
                    events += 1
                worker_emitter = Emitter(client, run.id, venue="local", worker_id=worker)
                with worker_emitter.span("SubQuery.Execute", parent=sq.span_id) as ex:
                    ex.end(tokens_in=100, tokens_out=10, cost=0.1)
                events += 2
                if budget and i < 3:
                    settled += 0.1
                    conductor.instant(
                        "Budget.Settle",
                        parent=sq.span_id,
                        attrs={
                            "reservation": f"res{i}",
                            "subquery": sq.span_id,
                            "provider": "sim",
                            "worker": worker,
                            "reserved": 0.1,
                            "tokens_in": 100,
                            "tokens_out": 10,
                            "cost": 0.1,
                            "released": False,
                            "run_settled": settled,
                            "run_committed": committed,
                            "run_cap": cap,
                        },
                    )
                    verdict = HOSTILE_VERDICT if i == 2 else "accepted"
                    conductor.instant(
                        "Receipt.Emit",
                        parent=sq.span_id,
                        worker_id=worker,
                        attrs=receipt(run.id, sq.span_id, worker, 0.1, verdict, i + 1),
                    )
                    events += 2
                if budget and i == 3 and cap is not None:
                    conductor.instant(
                        "Budget.Alert",
                        parent=sq.span_id,
                        attrs={
                            "scope": "run",
                            "key": "run",
                            "cap": cap,
                            "committed": committed,
                            "fraction": committed / cap,
                            "threshold": 0.8,
                        },
                    )
                    events += 1
                if budget and i < 2:
                    conductor.instant(
                        "Verify.Redundant",
                        parent=sq.span_id,
                        status="ok" if i == 0 else "rejected",
                        attrs={"tier": "redundant", "outcome": "accept" if i == 0 else "reject"},
                    )
                    events += 1
            events += 2
        conductor.instant("Run.Done", parent=root.span_id, attrs={"answer": "42"})
        events += 5  # the done instant, the cell's and the root's start and end
    wait_until(lambda: store.event_count(run.id) >= events, timeout=20, what="the run stored")
    return events


def fill_texts(page) -> str:
    """The fill view's annotations (SVG text: read by textContent)."""
    return " | ".join(
        page.locator("#view-fill .annotation-text").evaluate_all("es => es.map(e => e.textContent)")
    )


def test_it_shows_budget_receipts_and_verification_at_the_movies_clock(page, web, staff):
    run = a_run(staff, "spending")
    write_run(run, budget=True)
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(page, "Number(document.getElementById('movie').dataset.viewsDrawn) >= 1")
    wait_for(page, "document.querySelector('[data-metric=receipts]').textContent === '3'")
    detail = page.inner_text("[data-metric=receipt-detail]")
    assert "$0.2000 paid" in detail and "2 accepted" in detail  # nothing for the third
    assert f"1 {HOSTILE_VERDICT}" in detail  # a verdict is text, never markup
    assert page.locator("#run-header script").count() == 0
    assert page.inner_text("[data-metric=verified]") == "50%"
    assert "2/4 sub-queries · 1 ok · 1 rejected · redundant 2" in page.inner_text(
        "[data-metric=verify-detail]"
    )
    wait_for(page, "document.querySelector('#view-fill .annotation-text') !== null")
    fill = fill_texts(page)
    assert "$0.3000 settled + $0.1000 reserved" in fill, fill
    assert "of $1.0000 cap (40%)" in fill
    assert "alert: run at 40%" in fill
    shot(page, "09-run-budget-receipts")
    # Back to the start of the run: nothing was spent yet, nothing received.
    page.click("[data-act=start]")
    wait_for(page, "document.querySelector('[data-metric=receipts]').textContent === 'none'")
    assert page.inner_text("[data-metric=verified]") == "none"
    wait_for(
        page,
        "[...document.querySelectorAll('#view-fill .annotation-text')]"
        ".some(e => e.textContent === 'no budget cap')",
    )
    page.click("[data-act=end]")
    wait_for(page, "document.querySelector('[data-metric=receipts]').textContent === '3'")
    assert page.evaluate("window.__pwned") is None


def test_it_says_no_budget_cap_without_budget_events_or_without_a_cap(page, web, staff):
    plain = a_run(staff, "no budget")
    write_run(plain, budget=False)
    page.goto(f"/runs/{plain.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(page, "document.querySelector('#view-fill .annotation-text') !== null")
    assert "no budget cap" in fill_texts(page)
    assert page.inner_text("[data-metric=receipts]") == "none"
    assert page.inner_text("[data-metric=verified]") == "none"

    uncapped = a_run(staff, "uncapped")
    write_run(uncapped, budget=True, cap=None)
    page.goto(f"/runs/{uncapped.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(page, "document.querySelector('#view-fill .annotation-text') !== null")
    fill = fill_texts(page)
    assert "$0.3000 settled + $0.1000 reserved" in fill and "no budget cap" in fill, fill


def test_it_shows_each_venues_queue_apart_from_what_runs(page, web, staff):
    """The fill view's queue depth: sent to a venue but not started by a worker yet."""
    run = a_run(staff, "queues")
    client = get_redis()
    conductor = Emitter(client, run.id, venue="conductor")
    root = conductor.start("Run.Init")
    sent = [conductor.start("SubQuery.Submit", parent=root.span_id, venue="edge") for _ in range(3)]
    Emitter(client, run.id, venue="edge", worker_id="w1").start(
        "SubQuery.Execute", parent=sent[0].span_id
    )
    wait_until(lambda: store.event_count(run.id) >= 5, timeout=20, what="the run stored")
    page.goto(f"/runs/{run.id}")
    wait_for(page, "Number(document.getElementById('movie').dataset.viewsDrawn) >= 1")
    bars = page.evaluate(
        "Object.fromEntries(document.getElementById('view-fill').data"
        ".filter(t => t.type === 'bar' && !t.xaxis).map(t => [t.name, [t.y, t.x]]))"
    )
    assert bars["running"] == [["all", "edge"], [1, 1]], bars
    assert bars["queued"] == [["all", "edge"], [2, 2]], bars


def test_it_counts_model_calls_answered_from_a_cache(page, web, staff):
    """A replay's cassette answers model calls (spans marked replayed), and a backend may
    report its own cache: the fill view counts both."""
    run = a_run(staff, "cache")
    client = get_redis()
    conductor = Emitter(client, run.id, venue="conductor")
    worker = Emitter(client, run.id, venue="edge", worker_id="w1")
    with conductor.span("Run.Init") as root:
        with conductor.span("Run.Decode", parent=root.span_id) as turn:
            turn.end(tokens_in=10, tokens_out=5, replayed=True)
        with conductor.span("SubQuery.Submit", parent=root.span_id, venue="edge") as sq:
            with worker.span("SubQuery.Execute", parent=sq.span_id) as ex:
                ex.end(tokens_in=10, tokens_out=5, replayed=True)
            worker.instant("Memory.CacheMiss", parent=sq.span_id)
    wait_until(lambda: store.event_count(run.id) >= 9, timeout=20, what="the run stored")
    page.goto(f"/runs/{run.id}")
    wait_for(page, "document.querySelector('#view-fill .annotation-text') !== null")
    wait_for(
        page,
        "[...document.querySelectorAll('#view-fill .annotation-text')]"
        ".some(e => e.textContent.includes('cache 2 hits, 1 miss'))",
    )
