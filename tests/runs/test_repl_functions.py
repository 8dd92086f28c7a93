"""Each REPL function and each limit, through a real run: conductor, sandbox, venue
workers and the simulated model, driven by scripted root programs."""

from __future__ import annotations

import time

import pytest

from tests.helpers import finish, launch, named, scripted, trace
from traces import blobs, store

pytestmark = [pytest.mark.stack]

NEEDLE_TEXT = (
    "Filler. " * 200
    + "One of the special magic numbers for teal-otter is: 4417001. "
    + "More. " * 200
)


def needle_prompt(key: str, text: str) -> str:
    return (
        f"Find the special magic number for '{key}' in the text below. Reply with the number "
        f"only, or NONE if it is not there.\n\nTEXT:\n{text}"
    )


def test_it_reads_the_context_variable_and_keeps_variables_between_cells(venues):
    run = finish(launch(text="abcdef" * 10, question=scripted("n = len(context)", "FINAL(n * 2)")))
    assert run.status == "succeeded", run.error
    assert run.answer == "120"


def test_it_answers_with_final_var_and_shows_vars(venues):
    run = finish(launch(question=scripted("answer = 41 + 1\nSHOW_VARS()", 'FINAL_VAR("answer")')))
    assert run.status == "succeeded", run.error
    assert run.answer == "42"
    events = trace(run)
    first_cell = named(events, "Repl.Exec", "end")[0]
    shown = blobs.blob_get(first_cell["payload_ref"])
    assert "answer" in shown and "int" in shown


def test_it_runs_llm_query_on_a_worker(venues):
    code = f"r = llm_query({needle_prompt('teal-otter', NEEDLE_TEXT)!r})\nFINAL(r)"
    run = finish(launch(question=scripted(code)))
    assert run.status == "succeeded", run.error
    assert run.answer == "4417001"
    assert run.subqueries == 1
    events = trace(run)
    (execute,) = named(events, "SubQuery.Execute", "end")
    assert execute["venue"] in {"local", "edge"} and execute["worker_id"]


def test_it_returns_batched_replies_in_the_order_of_the_prompts(venues):
    texts = [
        f"Filler. The special magic number for key-{i} is: {1000000 + i}. End." for i in range(12)
    ]
    prompts = [needle_prompt(f"key-{i}", t) for i, t in enumerate(texts)]
    code = f"rs = llm_query_batched({prompts!r})\nFINAL(','.join(rs))"
    run = finish(launch(question=scripted(code)))
    assert run.status == "succeeded", run.error
    assert run.answer.split(",") == [str(1000000 + i) for i in range(12)]


def test_it_runs_a_child_rlm_one_level_deeper(venues):
    question = "What is the special magic number for teal-otter mentioned in the provided text?"
    code = f"child = rlm_query({question!r}, context={NEEDLE_TEXT!r})\nFINAL(child)"
    run = finish(launch(question=scripted(code), policy={"max_depth": 1}))
    assert run.status == "succeeded", run.error
    assert run.answer == "4417001"
    events = trace(run)
    assert any(e["depth"] == 1 for e in named(events, "Run.Decode", "end"))
    assert any(e["attrs"].get("kind") == "rlm" for e in named(events, "SubQuery.Submit", "start"))


def test_it_answers_rlm_query_past_the_depth_limit_as_a_plain_sub_query(venues):
    prompt = needle_prompt("teal-otter", "")
    code = f"child = rlm_query({prompt!r}, context={NEEDLE_TEXT!r})\nFINAL(child)"
    run = finish(launch(question=scripted(code), policy={"max_depth": 0}))
    assert run.status == "succeeded", run.error
    assert run.answer == "4417001"
    events = trace(run)
    assert not [e for e in named(events, "Run.Decode") if e["depth"] > 0]
    rejected = [e for e in named(events, "SubQuery.Retry") if e["status"] == "rejected"]
    assert "exceeds policy.max_depth=0" in rejected[0]["attrs"]["reason"]


def test_it_takes_model_only_when_it_names_the_runs_model_and_refuses_unknown_keywords(venues):
    """Code written for the original RLM passes model=: it was ignored, and the sub-query
    ran on another model than it asked for. A keyword FRLM does not know was ignored too."""
    prompt = needle_prompt("teal-otter", NEEDLE_TEXT)
    code = (
        "said = []\n"
        f"said.append(llm_query({prompt!r}, model='frlm-sim-worker'))\n"
        "for call in (lambda: llm_query('p', model='gpt-5-mini'),\n"
        "             lambda: llm_query_batched(['p'], model='gpt-5-mini'),\n"
        "             lambda: rlm_query('p', model='frlm-sim-worker'),\n"
        "             lambda: llm_query('p', temperature=0)):\n"
        "    try:\n"
        "        call()\n"
        "    except Exception as e:\n"
        "        said.append(type(e).__name__ + ': ' + str(e))\n"
        "FINAL('\\n'.join(said))"
    )
    run = finish(launch(question=scripted(code), policy={"max_depth": 1}))
    assert run.status == "succeeded", run.error
    ok, worker, batched, child, unknown = run.answer.split("\n")
    assert ok == "4417001"
    assert worker.startswith("RuntimeError: llm_query(model='gpt-5-mini'): this run's worker ")
    assert "model is 'frlm-sim-worker', chosen at launch; drop model=" in worker
    assert batched.startswith("RuntimeError: llm_query_batched(model='gpt-5-mini')")
    assert child.startswith("RuntimeError: rlm_query(model='frlm-sim-worker'): this run's root")
    assert unknown.startswith("TypeError: ")
    assert unknown.endswith("llm_query() got an unexpected keyword argument 'temperature'")
    assert run.subqueries == 1


def test_it_enforces_the_batch_limit_outside_the_repl(venues):
    code = (
        "try:\n    llm_query_batched(['a', 'b', 'c'])\nexcept RuntimeError as e:\n    FINAL(str(e))"
    )
    run = finish(launch(question=scripted(code), policy={"max_batch": 2}))
    assert run.status == "succeeded", run.error
    assert "at most 2 per batch (policy.max_batch)" in run.answer
    assert run.subqueries == 0


def test_it_enforces_the_sub_query_limit_across_calls(venues):
    code = (
        "llm_query_batched(['a', 'b'])\n"
        "try:\n    llm_query_batched(['c', 'd'])\nexcept RuntimeError as e:\n    FINAL(str(e))"
    )
    run = finish(launch(question=scripted(code), policy={"max_subqueries": 3}))
    assert run.status == "succeeded", run.error
    assert "may make 3 sub-queries in all" in run.answer
    assert run.subqueries == 2


def test_it_reports_an_exception_to_the_model_and_goes_on(venues):
    run = finish(launch(question=scripted("1 / 0", "FINAL('recovered')")))
    assert run.status == "succeeded", run.error
    assert run.answer == "recovered"
    events = trace(run)
    failed = [e for e in named(events, "Repl.Exec", "end") if e["status"] == "error"]
    assert failed and failed[0]["attrs"]["error"] == "exception"


def test_it_fails_the_run_after_too_many_repl_errors(venues):
    run = finish(
        launch(question=scripted("1 / 0", "2 / 0", "FINAL('never')"), policy={"max_errors": 1})
    )
    assert run.status == "failed"
    assert "the REPL failed 2 times (policy.max_errors=1)" in run.error
    # max_errors=0 rides out no failed cell, and says "1 time" (it said "1 times").
    once = finish(launch(question=scripted("1 / 0", "FINAL('never')"), policy={"max_errors": 0}))
    assert once.status == "failed"
    assert "the REPL failed 1 time (policy.max_errors=0)" in once.error
    assert named(trace(run), "Run.Done")[0]["status"] == "error"


def test_it_kills_a_cell_past_its_wall_clock_and_goes_on(venues):
    run = finish(
        launch(
            question=scripted("import time\ntime.sleep(30)", "FINAL('after')"),
            policy={"cell_timeout_s": 1},
        )
    )
    assert run.status == "succeeded", run.error
    assert run.answer == "after"
    events = trace(run)
    timed_out = [
        e for e in named(events, "Repl.Exec", "end") if e["attrs"].get("error") == "timeout"
    ]
    assert timed_out and timed_out[0]["attrs"]["restarted"] is True


def test_a_cancel_ends_a_running_cell_at_once(venues):
    """A run cancelled while its cell's own code runs (a sleep, a long loop) ends within a
    second or so, not at the cell's wall clock: it held the run, its conductor slot and the
    REPL until then, whatever the user asked."""
    from runs.models import Run
    from runs.services import run_cancel
    from tests.helpers import wait_until

    run = launch(question=scripted("import time\ntime.sleep(60)", "FINAL('never')"))
    wait_until(
        lambda: any(e["name"] == "Repl.Exec" for e in store.read_events(run.id)),
        timeout=30,
        what="the cell to start",
    )
    asked = time.monotonic()
    run_cancel(run)
    finish(run, timeout=60)
    took = time.monotonic() - asked
    assert run.status == Run.Status.CANCELLED, (run.status, run.error)
    assert took < 5, f"the run ended {took:.1f} s after its cancel, its cell asleep meanwhile"
    cell = named(trace(run), "Repl.Exec", "end")
    assert cell and cell[0]["status"] == "error", cell
    assert "cancelled" in cell[0]["attrs"]["error"], cell[0]["attrs"]


def test_a_cancel_ends_a_run_whose_root_model_is_slow_to_answer(venues):
    """A run cancelled while its root model's call was under way waited out the call's
    timeout and its tries, minutes, still `running` (a review): it ends within a second
    or so now, and the turn's span says it was cancelled."""
    import threading

    from runs.models import Run
    from runs.services import run_cancel
    from tests.helpers import endpoint, wait_until
    from workers.backends import ModelSpec

    release = threading.Event()

    def slow(_request):
        release.wait(60)
        return 500, b'{"error": {"message": "released"}}'

    try:
        with endpoint(slow) as (url, seen):
            run = launch(question="What is 2 + 2?", root=ModelSpec("openai", "slow-root", url))
            wait_until(lambda: seen, timeout=30, what="the root model's call")
            asked = time.monotonic()
            run_cancel(run)
            finish(run, timeout=60)
            took = time.monotonic() - asked
            release.set()
    finally:
        release.set()
    assert run.status == Run.Status.CANCELLED, (run.status, run.error)
    assert took < 5, f"the run ended {took:.1f} s after its cancel, its root call waited out"
    (decode,) = named(trace(run), "Run.Decode", "end")
    assert decode["status"] == "cancelled", decode


def test_a_batch_whose_every_sub_query_timed_out_fails_the_run(venues):
    """Every sub-query erroring failed the run, but every one timing out let the program
    go on with markers and the run "succeeded" with an answer made from nothing (a
    review)."""
    program = "rs = llm_query_batched(['a?', 'b?'])\nprint(rs)"
    run = finish(
        launch(
            question=scripted(program, "FINAL('made up')"),
            worker_sim={"latency_ms": 3000},
            policy={"subquery_timeout_s": 0.5, "max_retries": 0, "hedge": "off"},
        ),
        timeout=60,
    )
    assert run.status == "failed", (run.status, run.answer)
    assert "every sub-query of a batch of 2 failed" in run.error, run.error


def test_it_asks_for_a_best_answer_at_max_turns(venues):
    run = finish(
        launch(question=scripted("print('partial: 7')", "print('more')"), policy={"max_turns": 1})
    )
    assert run.status == "succeeded", run.error
    assert run.turns == 2  # the one allowed turn, then the request for a final answer
    assert run.answer == "partial: 7"
