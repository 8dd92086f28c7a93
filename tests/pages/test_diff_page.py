"""The trace diff page: a run and its what-if replay, launched from the run page."""

from __future__ import annotations

import re

from runs.models import Run
from tests.helpers import finish, launch, scripted, trace
from tests.pages.helpers import shot, wait_for

BATCH = (
    "rs = llm_query_batched(['q %d' % i for i in range(20)])\n"
    "print(sum(r.startswith('[frlm:') for r in rs))"
)
STRAGGLERS = {"latency_ms": 40, "straggler_rate": 0.3, "straggler_factor": 25, "seed": 11}


def test_it_compares_a_run_with_its_what_if_replay(page, web):
    original = finish(
        launch(
            question=scripted("print('turn one')", BATCH, "FINAL('done')"),
            worker_sim=STRAGGLERS,
            policy={"hedge": "off"},  # the what-if is about the quorum's cancels
        )
    )
    assert original.status == "succeeded", original.error
    trace(original)
    page.goto(f"/runs/{original.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    page.click("details.replay summary")
    page.fill("#id_from_turn", "1")
    page.fill("#id_quorum", "0.6")
    page.click(".replay-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/runs/r[0-9a-f]+$"))
    copy = Run.objects.get(id=page.url.rsplit("/", 1)[1])
    assert copy.replay_of_id == original.id and copy.replay_turn == 1
    assert copy.policy["quorum"] == 0.6 and copy.owner.username == "ops"
    finish(copy)
    assert copy.status == "succeeded", copy.error
    trace(copy)
    wait_for(page, "document.getElementById('run-header').dataset.done === '1'")
    # "Compare with…" offers the source first; "Diff with source" puts it on the left.
    assert page.input_value("#compare-b") == original.id
    page.click("#diff-source")
    page.wait_for_url(re.compile(rf".*/diff\?a={original.id}&b={copy.id}$"))
    page.wait_for_selector("#diff-movie[data-ready='1']")
    divergence = page.locator("#divergence")
    assert "found" in divergence.get_attribute("class")
    text = divergence.inner_text()
    assert "quorum" in text.lower()
    assert page.locator("table.deltas tbody tr").count() > 3
    assert page.locator("table.deltas tr.changed").count() >= 1
    # The changed input is listed by key, and both waterfalls are drawn, with spans ringed.
    assert "policy.quorum" in page.inner_text("body")
    sizes = page.evaluate(
        "[...document.querySelectorAll('#diff-movie canvas.wf-canvas')].map(c => c.height)"
    )
    assert len(sizes) == 2 and all(h > 100 for h in sizes)
    assert int(page.get_attribute("#wf-a", "data-ringed")) >= 1
    assert int(page.get_attribute("#wf-b", "data-ringed")) >= 1
    # Workers are named as on the run page, not by their ids (a review).
    ran = {e["worker_id"] for e in trace(original) if e["name"] == "SubQuery.Execute"}
    names = page.evaluate(f"{sorted(ran)!r}.map(id => FRLM.workers.name(id))")
    assert names and not set(names) & ran, names
    shot(page, "07-diff")


def test_it_offers_runs_to_compare(page, web):
    run = finish(launch(question=scripted("FINAL('x')")))
    page.goto(f"/diff?a={run.id}")
    assert page.input_value("input[name=a]") == run.id
    assert page.locator(f"a[href='/runs/{run.id}']").count() >= 1
    assert page.goto("/diff?a=rnothere&b=rnothere2").status == 404
    # An unknown id comes back on the chooser, named, with what was typed kept.
    assert page.goto(f"/diff?a={run.id}&b=rnothere").status == 404
    said = page.inner_text("#pick-errors")
    assert "B: no run 'rnothere' that you may see" in said and "A:" not in said
    assert page.input_value("input[name=a]") == run.id
    assert page.input_value("input[name=b]") == "rnothere"


def test_the_replay_form_keeps_what_was_typed_while_a_finished_runs_page_loads(page, web):
    """The page of a finished run reads its stored trace after the header is drawn; when it
    reaches Run.Done it must not draw the header again under a user who has opened the
    Replay form (a CI run lost the form that way, mid-typing)."""
    run = finish(launch(question=scripted(BATCH, "FINAL('done')")))
    assert run.status == "succeeded", run.error
    trace(run)
    # The trace is held back until the form is open, as a loaded server does by itself.
    held: list = []
    holding = [True]

    def hold(route) -> None:
        if holding[0]:
            held.append(route)
        else:
            route.continue_()

    page.route("**/api/runs/*/events*", hold)
    page.goto(f"/runs/{run.id}")
    page.click("details.replay summary")
    page.fill("#id_quorum", "0.6")
    while not held:
        page.wait_for_timeout(50)
    holding[0] = False
    for route in held:
        route.continue_()
    page.wait_for_selector("#movie[data-complete='1']")
    page.wait_for_timeout(1000)  # past the moment Run.Done's follow-up runs (400 ms)
    assert page.locator("details.replay").evaluate("d => d.open")
    assert page.input_value("#id_quorum") == "0.6"


def test_a_refused_replay_comes_back_open_with_what_was_typed_and_why(page, web):
    """A refused replay came back with the panel closed and its values reset, the reasons
    only in a flash message (a review)."""
    run = finish(launch(question=scripted("FINAL('done')")))
    assert run.status == "succeeded", run.error
    page.goto(f"/runs/{run.id}")
    page.click("details.replay summary")
    page.fill("#id_from_turn", "99")
    page.fill("#id_quorum", "0.5")
    page.click(".replay-form button[type=submit]")
    page.wait_for_selector("#replay-errors")
    assert page.locator("details.replay").evaluate("d => d.open")
    assert "has root turns 1 to 1; got 99" in page.inner_text("#replay-errors")
    assert page.input_value("#id_from_turn") == "99"
    assert page.input_value("#id_quorum") == "0.5"
    assert not Run.objects.filter(replay_of=run).exists()
    page.fill("#id_from_turn", "")
    page.fill("#id_quorum", "7")
    page.click(".replay-form button[type=submit]")
    page.wait_for_selector("#replay-errors")
    assert "0.05" in page.inner_text("#replay-errors")  # the quorum's range
    assert page.input_value("#id_quorum") == "7"
    # Said under the field's label, not its name in the code or the command's option
    # (a review read "Live from root turn: from_turn: ... (--from-turn K)").
    page.fill("#id_quorum", "0.5")
    page.click(".replay-form button[type=submit]")
    page.wait_for_selector("#replay-errors")
    said = page.inner_text("#replay-errors")
    assert "Recorded root turns, then live: a full replay only plays" in said, said
    assert "from_turn" not in said and "--from-turn" not in said
