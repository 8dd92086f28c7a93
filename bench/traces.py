"""Trace store benchmark, measured in one run:

recorder throughput      synthetic events through the real stream, recorder and Parquet
                         store (target 100,000 events/s)
span tree query          of a 10,000-span run, cold, from another connection (target < 200 ms)
diff                     of two 10,000-span runs (target < 1 s)
tracing overhead         the fanout benchmark's batch with events on and off (target < 2%)

  .venv/bin/python bench/traces.py [--events 200000] [--skip-overhead]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import redis
from _stack import private_stack, run_to_end  # sets up Django on a private instance
from django.conf import settings

from frlm_web.stack import VenueSpec, free_port
from traces import store
from traces.emitter import Emitter
from traces.recorder import Recorder


def synthetic_run(client: redis.Redis, run_id: str, spans: int, *, payload_every: int = 3) -> int:
    """A run shaped like a real one: turns, batches of sub-queries with worker spans.
    Returns the number of events emitted."""
    emitter = Emitter(client, run_id)
    worker = Emitter(client, run_id, venue="edge", worker_id="edge-1")
    sent = 0
    with emitter.batch():
        root = emitter.start("Run.Init", question="benchmark")
        made = 1
        turn = 0
        while made < spans:
            turn += 1
            decode = emitter.start("Run.Decode", parent=root.span_id, turn=turn)
            decode.end(payload=f"reply of turn {turn}", tokens_in=900, tokens_out=120)
            cell = emitter.start("Repl.Exec", parent=root.span_id, turn=turn, cell=turn)
            made += 2
            for i in range(min(500, (spans - made) // 2)):
                prompt = (
                    f"question {turn}.{i} about a fragment " if i % payload_every == 0 else None
                )
                submit = emitter.start(
                    "SubQuery.Submit",
                    parent=cell.span_id,
                    venue="edge",
                    payload=prompt,
                    route="most free credit",
                )
                execute = worker.start("SubQuery.Execute", parent=submit.span_id)
                worker_events = [
                    worker.build(
                        "SubQuery.Execute",
                        "end",
                        span_id=execute.span_id,
                        parent=submit.span_id,
                        ms=200.0,
                        tokens_in=6000,
                        tokens_out=3,
                        cost=0.0009,
                    )
                ]
                emitter._held.extend(worker_events)  # the worker's end, in this batch
                emitter.instant("SubQuery.Return", parent=submit.span_id, sq=i)
                submit.end("ok", tokens_in=6000, tokens_out=3)
                made += 2
            cell.end(payload="output")
        root.end()
        sent = len(emitter._held)
    return sent


def recorder_throughput(client: redis.Redis, total: int) -> tuple[float, float, int]:
    """Events stored per second of wall time, and per second of the recorder's CPU time
    (steadier on a shared machine: other programs' load does not count)."""
    runs = max(1, total // 20_000)
    emitted = sum(synthetic_run(client, f"rbench{i}", 20_000 // 2) for i in range(runs))
    recorder = Recorder(client, batch_max=20_000, block_ms=1)
    recorder.ensure_group()
    started, cpu = time.perf_counter(), time.process_time()
    stored = 0
    while stored < emitted:
        stored += recorder.step()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return emitted / wall, emitted / cpu, emitted


def timed(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def fanout_batch_seconds(trace_events: bool, n: int = 256) -> float:
    import os

    os.environ["FRLM_TRACE_EVENTS"] = "1" if trace_events else "0"
    sim = {"latency_ms": 200, "spread": 0}
    venues = [VenueSpec("local", 16, sim, "tb-local"), VenueSpec("edge", 16, sim, "tb-edge")]
    program = (
        "Run.\n```repl\nimport time\nprompts = ['q %d' % i for i in range(" + str(n) + ")]\n"
        "t = time.perf_counter()\nrs = llm_query_batched(prompts)\n"
        "FINAL(f'{time.perf_counter() - t:.4f}')\n```"
    )
    with private_stack(venues):
        run_to_end(program.replace(str(n), "32"), venues=["local", "edge"])
        return min(
            float(run_to_end(program, venues=["local", "edge"], policy={"max_batch": 512}).answer)
            for _ in range(3)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        client = redis.Redis(port=port)
        rate, cpu_rate, emitted = recorder_throughput(client, args.events)
        synthetic_run(client, "rtreeA", 10_000)
        synthetic_run(client, "rtreeB", 10_000)
        recorder = Recorder(client, block_ms=1)
        while recorder.step():
            pass
    finally:
        server.terminate()
    spans_a = sum(1 for e in store.read_events("rtreeA") if e["phase"] == "start")
    tree_s = timed(lambda: store.span_tree("rtreeA"))
    try:
        from traces.diff import run_diff

        diff_s = timed(lambda: run_diff("rtreeA", "rtreeB"), repeat=3)
    except ImportError:
        diff_s = None

    print("trace store benchmark (store at " + str(Path(settings.FRLM_TRACE_DIR)) + ")")
    print(
        f"  recorder throughput      {rate:10,.0f} events/s   ({emitted:,} events; target 100,000)"
    )
    print(f"  ... per recorder CPU s   {cpu_rate:10,.0f} events")
    print(
        f"  span tree query          {tree_s * 1000:10.1f} ms       "
        f"({spans_a:,} spans; target < 200 ms)"
    )
    if diff_s is not None:
        print(f"  diff of two such runs    {diff_s * 1000:10.1f} ms       (target < 1,000 ms)")
    if not args.skip_overhead:
        on = fanout_batch_seconds(True)
        off = fanout_batch_seconds(False)
        print(f"  fanout batch, traced     {on:10.3f} s")
        print(f"  fanout batch, untraced   {off:10.3f} s")
        print(f"  tracing overhead         {(on - off) / off * 100:+10.1f} %       (target < 2%)")


if __name__ == "__main__":
    main()
