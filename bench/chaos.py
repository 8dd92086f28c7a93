"""Chaos benchmark: kill -9 one process of the stack in the middle of a run, and check that
the run and its trace come through whole, with nobody restarting anything by hand.

One case per process: a venue worker, the recorder, the live forwarder, the conductor and
Redis itself. Each case starts a private stack (Redis with its AOF on, the stack's
supervisor on), launches a run of --n sub-queries spread over two venues, kills its victim
with SIGKILL once a third of them have settled, and waits. Per case it reports:

- the run's outcome: succeeded with the right answer, or failed with its reason (what a
  conductor death without takeover must give);
- events emitted (the run's seq counter in Redis) against events stored, missing and
  duplicated seqs;
- spans left open (a `start` with no `end`) once the recorder has caught up;
- recovery: for a worker, kill -9 -> Worker.Lost and -> first re-dispatch of its jobs, from
  the trace; for the other processes, kill -9 -> the supervisor's restart is up again; for a
  conductor, kill -9 -> the run's end.

    .venv/bin/python bench/chaos.py [--n 300] [--latency-ms 100] [--cases worker,redis]
                                    [--quick]

SIGTERM or SIGINT stops it cleanly: the private stack goes with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _stack import private_stack, stop_on_signals
from fanout import timed_program

from frlm_web.stack import Stack, VenueSpec

CASES = ("worker", "recorder", "forwarder", "conductor", "redis")
VICTIMS = {
    "worker": "worker-local-worker",
    "recorder": "recorder",
    "forwarder": "forwarder",
    "conductor": "conductor",
    "redis": "redis",
}
CATCH_UP_S = 60.0


@dataclass
class Outcome:
    case: str
    status: str = "?"
    correct: bool = False
    reason: str = ""
    emitted: int = 0
    stored: int = 0
    missing: int = 0
    duplicated: int = 0
    open_spans: int = 0
    recovery: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    run_id: str = ""

    @property
    def whole(self) -> bool:
        ended = (self.status == "succeeded" and self.correct) or (
            self.case == "conductor" and self.status == "failed" and bool(self.reason)
        )
        return ended and not self.missing and not self.duplicated and not self.open_spans


def venues(latency_ms: float) -> list[VenueSpec]:
    return [
        VenueSpec("local", concurrency=16, sim={"latency_ms": latency_ms}),
        VenueSpec("edge", concurrency=16, sim={"latency_ms": latency_ms}, worker_name="edge-c1"),
    ]


def wait_settled(client, run_id: str, target: int, timeout: float) -> None:
    from runs.engine.progress import read_progress

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if int(read_progress(client, run_id).get("settled", 0)) >= target:
                return
        except Exception:  # noqa: BLE001 (Redis may be the victim of an earlier case)
            pass
        time.sleep(0.01)
    raise SystemExit(f"run {run_id}: {target} sub-queries did not settle in {timeout:.0f} s")


def wait_run(run_id: str, timeout: float):
    from runs.models import Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(id=run_id)
        if run.done:
            return run
        time.sleep(0.05)
    raise SystemExit(f"run {run_id} did not end within {timeout:.0f} s of the kill")


def emitted_count(stack: Stack, run_id: str) -> int:
    deadline = time.monotonic() + CATCH_UP_S
    while True:
        try:
            return int(stack.client.get(f"frlm:seq:{run_id}") or 0)
        except Exception:  # noqa: BLE001 (Redis still coming back)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def stored_events(stack: Stack, run_id: str) -> tuple[int, list[dict]]:
    """Wait for the recorder to store every event emitted for the run (or give up after
    CATCH_UP_S); the emitted count and what is stored."""
    from traces import store

    deadline = time.monotonic() + CATCH_UP_S
    while True:
        emitted = emitted_count(stack, run_id)
        events = store.read_events(run_id)
        done = any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events)
        if (done and len({e["seq"] for e in events}) >= emitted) or time.monotonic() > deadline:
            return emitted, events
        time.sleep(0.2)


def open_spans(events: list[dict]) -> int:
    started = {e["span_id"] for e in events if e["phase"] == "start"}
    ended = {e["span_id"] for e in events if e["phase"] == "end"}
    return len(started - ended)


def worker_recovery(events: list[dict], killed: float) -> dict[str, float]:
    lost = [e["ts"] / 1e9 - killed for e in events if e["name"] == "Worker.Lost"]
    retry = [
        e["ts"] / 1e9 - killed
        for e in events
        if e["name"] == "SubQuery.Retry" and "lost" in str(e["attrs"].get("reason", ""))
    ]
    found = {}
    if lost:
        found["lost_s"] = min(lost)
    if retry:
        found["redispatch_s"] = min(retry)
    return found


def wait_back(stack: Stack, name: str, old_pid: int, killed: float) -> float | None:
    """Seconds from the kill until the supervisor's new process for `name` is ready."""
    proc = stack.procs[name]
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        popen = stack.procs[name].popen
        if popen is not None and popen.pid != old_pid and popen.poll() is None:
            try:
                if proc.ready():
                    return time.time() - killed
            except Exception:  # noqa: BLE001 (not ready yet)
                pass
        time.sleep(0.02)
    return None


def run_case(case: str, args: argparse.Namespace) -> Outcome:
    from django.conf import settings

    from runs.services import ContextSpec, run_create, run_launch
    from workers.backends import model_spec

    outcome = Outcome(case)
    # Each case starts from an empty Redis: no queue or stream left by the case before.
    shutil.rmtree(Path(settings.DATA_DIR) / "stack" / "appendonlydir", ignore_errors=True)
    with private_stack(venues(args.latency_ms), persist=True, supervise=True) as stack:
        run = run_create(
            question=timed_program(args.n, sequential=False),
            context=ContextSpec(text="benchmark"),
            policy={
                "max_batch": args.n,
                "max_subqueries": 3 * args.n,
                "subquery_timeout_s": 60,
                "cell_timeout_s": 600,
            },
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local", "edge"],
        )
        outcome.run_id = str(run.id)
        started = time.monotonic()
        run_launch(run)
        wait_settled(stack.client, run.id, max(1, args.n // 3), timeout=120)
        victim = VICTIMS[case]
        old_pid = stack.procs[victim].popen.pid
        killed = time.time()
        stack.kill(victim)
        if case != "worker":
            back = wait_back(stack, victim, old_pid, killed)
            if back is not None:
                outcome.recovery["restarted_s"] = back
        run = wait_run(run.id, timeout=300)
        outcome.wall_s = time.monotonic() - started
        outcome.status = run.status
        outcome.reason = run.error or ""
        if run.status == "succeeded":
            _elapsed, failed = (run.answer or "0 -1").split()
            outcome.correct = failed == "0"
        if case == "conductor" and run.finished:
            outcome.recovery["run_ended_s"] = run.finished.timestamp() - killed
        outcome.emitted, events = stored_events(stack, run.id)
        seqs = Counter(e["seq"] for e in events)
        outcome.stored = len(events)
        outcome.duplicated = sum(n - 1 for n in seqs.values())
        outcome.missing = sum(1 for s in range(1, outcome.emitted + 1) if s not in seqs)
        outcome.open_spans = open_spans(events)
        if case == "worker":
            outcome.recovery.update(worker_recovery(events, killed))
        if case == "worker" and "redispatch_s" not in outcome.recovery:
            outcome.reason = outcome.reason or "no re-dispatch of the killed worker's jobs"
    return outcome


def table(outcomes: list[Outcome]) -> str:
    head = (
        f"{'case':<10} {'run':<10} {'ok':<3} {'emitted':>7} {'stored':>7} {'missing':>7} "
        f"{'dup':>4} {'open':>5} {'wall s':>7}  recovery"
    )
    lines = [head, "-" * len(head)]
    for o in outcomes:
        recovery = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in o.recovery.items()) or "-"
        lines.append(
            f"{o.case:<10} {o.status:<10} {'yes' if o.whole else 'NO':<3} {o.emitted:>7} "
            f"{o.stored:>7} {o.missing:>7} {o.duplicated:>4} {o.open_spans:>5} "
            f"{o.wall_s:>7.2f}  {recovery}"
        )
        if o.reason:
            lines.append(f"{'':<10} reason: {o.reason[:150]}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="sub-queries in each case's run")
    parser.add_argument("--latency-ms", type=float, default=100, help="simulated model latency")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}"
    )
    parser.add_argument("--quick", action="store_true", help="150 sub-queries of 50 ms")
    args = parser.parse_args()
    if args.quick:
        args.n, args.latency_ms = 150, 50
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.n < 3 or args.latency_ms <= 0:
        parser.error(
            f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}"
            if unknown
            else "--n must be at least 3 and --latency-ms above 0"
        )
    stop_on_signals()
    print(
        f"chaos: {args.n} sub-queries of {args.latency_ms:g} ms over venues local and edge, "
        f"kill -9 after a third settled; cases: {', '.join(cases)}",
        flush=True,
    )
    outcomes = []
    for case in cases:
        outcome = run_case(case, args)
        outcomes.append(outcome)
        print(f"  {case}: {outcome.status}, run {outcome.run_id}", flush=True)
    print()
    print(table(outcomes))
    return 0 if all(o.whole for o in outcomes) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
