"""A `validate=` pattern that backtracks without end does not stall the conductor: its
checks run in a process of their own with a time limit (runs/trust/checker.py). A review's
`(a|a)*b` held the conductor at 100% CPU, every run on it stalled until a kill -9; here, on
a stack of its own, that run ends and another run on the same conductor meanwhile is not
held up."""

from __future__ import annotations

import time

import pytest

from frlm_web.stack import VenueSpec
from runs.trust.checker import SLOW_CHECKS_MAX
from tests.helpers import scripted, wait_until
from tests.ownstack import own_stack

pytestmark = [pytest.mark.stack]

EVIL = r"Summarise the text below\n(a|a)*b"


def test_a_backtracking_pattern_fails_its_check_and_stalls_no_run(stack, venues, tmp_path):
    from runs.models import Run
    from runs.services import ContextSpec, run_create
    from workers.backends import model_spec

    def create(program: str) -> Run:
        return run_create(
            question=scripted(program),
            context=ContextSpec(text="x"),
            policy={"max_retries": 1},
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )

    worker = [VenueSpec("local", concurrency=4, sim={"latency_ms": 20}, worker_name="redos-w1")]
    with own_stack(tmp_path, worker) as own:
        evil = create(
            "rs = [llm_query('Summarise the text below\\n' + 'a' * 40, "
            f"validate={EVIL!r}) for _ in range(6)]\n"
            "FINAL(str(sum(r.startswith('[frlm') for r in rs)))"
        )
        own.launch_run(evil.id)

        def checking() -> bool:
            return any(e["name"] == "SubQuery.Execute" for e in own.events(evil.id))

        wait_until(checking, timeout=60, every=0.05, what="the first reply to check")
        started = time.monotonic()
        other = create("FINAL(llm_query('Say hello. Fragment: hello'))")
        own.launch_run(other.id)

        def done(run_id: str) -> Run | None:
            found = Run.objects.get(id=run_id)
            return found if found.done else None

        other = wait_until(lambda: done(other.id), timeout=60, what="the other run")
        assert other.status == "succeeded", other.error
        assert time.monotonic() - started < 15  # not held behind the evil checks
        evil = wait_until(lambda: done(evil.id), timeout=120, what="the evil run to end")
        assert evil.status == "succeeded", evil.error
        verdicts = [
            e["attrs"]["reason"]
            for e in own.events(evil.id)
            if e["name"] == "Verify.Objective" and not e["attrs"].get("ok")
        ]
        slow = [v for v in verdicts if v.startswith("the check took longer than")]
        untried = [v for v in verdicts if v.startswith("not tried:")]
        assert 1 <= len(slow) <= SLOW_CHECKS_MAX, verdicts
        assert len(slow) < SLOW_CHECKS_MAX or untried, verdicts
        # Each failed its check, was asked again once (max_retries), then was rejected: with
        # one worker it was asked again without end before (1,471 times in 40 s).
        assert len(verdicts) == 12, verdicts
        assert evil.answer == "6"
