"""Failover after a worker's kill -9, measured from the trace.

A run of N sub-queries (400 ms each) on a venue of two workers, the survivor with room for
all of them; once the victim has started one, it is killed with SIGKILL. From the stored
trace: the time from the kill to Worker.Lost and to the first re-dispatch (SubQuery.Retry),
how many Execute spans it left open (none: they end as `abandoned`), and whether the run
succeeded with every reply.

Three kinds of worker, side by side in one stack with the product's presence TTL (6 s):
- broker: a Celery worker whose death its alive line tells (workers/alive.py);
- broker, presence only: the same with FRLM_WORKER_ALIVE_LINE=0, as before the alive line;
- gateway: a worker on the WebSocket gateway, whose close the server sees.

    python bench/failover.py --quick     # 2 rounds of each (about 3 minutes)
    python bench/failover.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "frlm_web.settings_isolated"

import django  # noqa: E402

django.setup()

from _stack import stop_on_signals  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from frlm_web import presence  # noqa: E402
from frlm_web.stack import Stack, free_port  # noqa: E402

# Fewer sub-queries than the survivor has slots: the re-dispatch waits for nothing but the
# news of the death (with every slot busy it would wait for a reply to free one).
N = 24
LATENCY_MS = 400
VICTIM_SLOTS, SURVIVOR_SLOTS = 4, 16
MANAGE = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]


class Bench:
    def __init__(self) -> None:
        from workers.models import Venue

        call_command("migrate", verbosity=0)
        Venue.objects.get_or_create(name="bkf", defaults={"kind": "datacenter", "trusted": True})
        self.gw, _ = Venue.objects.get_or_create(
            name="gwf", defaults={"kind": "edge", "trusted": False}
        )
        self.web_port = free_port()
        self.stack = Stack(
            state_dir=Path(settings.DATA_DIR) / "stack",
            venues=[],
            env={
                "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
                "FRLM_DB_PATH": str(settings.DATABASES["default"]["NAME"]),
                # The product's presence TTL, not the test suite's shorter one.
                "FRLM_VENUE_HEARTBEAT_TTL_S": "6",
            },
            web_port=self.web_port,
            start_redis=True,
            redis_persist=False,
        )
        self.procs: list[subprocess.Popen] = []

    def worker(self, kind: str, name: str, slots: int) -> subprocess.Popen:
        """A worker process of `kind` (broker, presence, gateway), up in presence."""
        sim = ["--concurrency", str(slots), "--sim-latency-ms", str(LATENCY_MS), "--name", name]
        home = Path(settings.DATA_DIR) / "far" / name
        home.mkdir(parents=True, exist_ok=True)
        if kind == "gateway":
            from workers import services

            token = services.token_create(self.gw, ttl=timedelta(hours=1), label="bench")[1]
            argv = [*MANAGE, "frlm_worker", "--venue", "gwf", "--server"]
            argv += [f"http://127.0.0.1:{self.web_port}", "--token", token, *sim]
            env = {
                "PATH": os.environ["PATH"],
                "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
                "FRLM_DATA_DIR": str(home),
                "FRLM_DB_PATH": str(home / "none.sqlite3"),
                "FRLM_REDIS_URL": "redis://127.0.0.1:1/0",
            }
            venue = "gwf"
        else:
            argv = [*MANAGE, "frlm_worker", "--venue", "bkf", *sim]
            env = self.stack.role_env("worker")
            env["FRLM_WORKER_ALIVE_LINE"] = "1" if kind == "broker" else "0"
            venue = "bkf"
        log = open(Path(settings.DATA_DIR) / "stack" / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            argv,
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        deadline = time.monotonic() + 90
        while not self.entry(venue, name):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} did not come up (see its log)")
            time.sleep(0.1)
        return proc

    def entry(self, venue: str, name: str) -> dict | None:
        group = f"venue:{venue}"
        return next(
            (w for w in presence.alive(self.stack.client, group) if w.get("label") == name), None
        )

    def round(self, kind: str, venue: str, victim_name: str) -> dict[str, float | int | str]:
        """One run, one kill; what the trace says."""
        from runs.models import Run
        from runs.services import ContextSpec, run_create, run_launch
        from traces import store
        from workers.backends import model_spec

        victim_proc = self.worker(kind, victim_name, VICTIM_SLOTS)
        victim = self.entry(venue, victim_name)["worker_id"]
        program = f"rs = llm_query_batched(['question %d' % i for i in range({N})])\n"
        program += "FINAL(str(sum(1 for r in rs if r and not r.startswith('[frlm'))))"
        run = run_create(
            question="Run this program.\n```repl\n" + program + "\n```",
            context=ContextSpec(text="failover"),
            policy={"max_retries": 3},
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=[venue],
        )
        run_launch(run)
        # Killed once it holds work: its first Execute span is in the results stream.
        key = f"frlm:run:{run.id}:results"
        deadline = time.monotonic() + 60
        while not any(
            f.get(b"worker_id", b"").decode() == victim and f.get(b"status") == b"started"
            for _, f in self.stack.client.xrange(key)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the victim never started a job")
            time.sleep(0.01)
        os.killpg(victim_proc.pid, signal.SIGKILL)
        killed = time.time_ns()
        victim_proc.wait(10)
        while not Run.objects.get(id=run.id).done:
            time.sleep(0.1)
        run = Run.objects.get(id=run.id)
        events: list[dict] = []
        deadline = time.monotonic() + 30
        while not any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
            events = store.read_events(run.id)
        ended = {e["span_id"] for e in events if e["phase"] == "end"}
        lost = [e["ts"] for e in events if e["name"] == "Worker.Lost"]
        retry = [e["ts"] for e in events if e["name"] == "SubQuery.Retry" and e["ts"] >= killed]
        return {
            "ok": int(run.status == "succeeded" and run.answer == str(N)),
            "lost_ms": (min(lost) - killed) / 1e6 if lost else float("nan"),
            "retry_ms": (min(retry) - killed) / 1e6 if retry else float("nan"),
            "abandoned": sum(
                1 for e in events if e["name"] == "SubQuery.Execute" and e["status"] == "abandoned"
            ),
            "open": sum(1 for e in events if e["phase"] == "start" and e["span_id"] not in ended),
        }

    def case(self, kind: str, rounds: int) -> list[dict]:
        venue = "gwf" if kind == "gateway" else "bkf"
        survivor = self.worker(kind, f"{kind}-keep", SURVIVOR_SLOTS)
        try:
            return [self.round(kind, venue, f"{kind}-v{i}") for i in range(rounds)]
        finally:
            os.killpg(survivor.pid, signal.SIGTERM)
            survivor.wait(30)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of each kind")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    stop_on_signals()
    bench = Bench()
    try:
        bench.stack.start()
        results = {kind: bench.case(kind, rounds) for kind in ("broker", "presence", "gateway")}
    finally:
        bench.stop()
    names = {
        "broker": "broker, alive line",
        "presence": "broker, presence only",
        "gateway": "gateway",
    }
    print(
        f"kill -9 of a worker holding jobs; {N} sub-queries of {LATENCY_MS} ms on a victim of "
        f"{VICTIM_SLOTS} slots and a survivor of {SURVIVOR_SLOTS}; {rounds} rounds"
    )
    print(
        f"{'worker':24} {'-> Lost ms':>11} {'-> re-dispatch ms':>18} "
        f"{'abandoned':>9} {'open':>5} {'ok':>4}"
    )
    medians = {}
    for kind, rows in results.items():
        for row in rows:
            print(
                f"{names[kind]:24} {row['lost_ms']:11.0f} {row['retry_ms']:18.0f} "
                f"{row['abandoned']:9d} {row['open']:5d} {row['ok']:4d}"
            )
        medians[kind] = statistics.median(r["retry_ms"] for r in rows)
    print(
        "median kill -> first re-dispatch: "
        + ", ".join(f"{names[k]} {v:.0f} ms" for k, v in medians.items())
    )
    if medians["broker"] > 0:
        print(f"presence only / alive line: {medians['presence'] / medians['broker']:.1f}x")


if __name__ == "__main__":
    main()
