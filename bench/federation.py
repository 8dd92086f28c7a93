"""Federation benchmark: the same batch over gateway workers and over broker workers, each
worker on a host of its own (a network namespace and a mount namespace, frlm_web/netlab.py).

Measured side by side in one run, alternating (gateway, broker, broker, gateway, ...):
- 256 sub-queries of 200 ms over 4 workers of 8 slots: wall time, ratio to the ideal
  ceil(N/W)*L, and the gateway's ratio to the broker's;
- CPU per sub-query: the web server (where the gateway runs) and the workers;
- failover: a gateway worker killed with -9 while it holds jobs; the time from the kill to
  Worker.Lost and to the first re-dispatch of its jobs, from the run's trace.

Gateway workers reach only the web server (through a forwarder on their host's veth, which
can add one-way delay: --wan-ms); broker workers reach the web server and Redis the same
way. Both run the simulated model in-process, so the model's latency is the same.

    .venv/bin/python bench/federation.py [--n 256 | --n 64,256,1024] [--latency-ms 200]
                                         [--workers 4] [--slots 8] [--repeat 3]
                                         [--failovers 3] [--wan-ms 0] [--quick]
                                         [--profile-web FILE]

--profile-web FILE runs the web server under cProfile (bench/_profiled_web.py), collects over
the measured gateway batches only, writes the profile to FILE and prints its top lines (the
CPU figures of a profiled run are inflated by the profiler: compare runs without it).

Each batch size is printed as soon as it is measured; the failover rounds come last.

SIGTERM or SIGINT stops it cleanly: workers, namespaces and the private stack go.
"""

from __future__ import annotations

import argparse
import math
import os
import pstats
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

from _stack import run_to_end, stop_on_signals
from django.conf import settings
from fanout import harness_floor, timed_program

from frlm_web import netlab, redis_acl
from frlm_web.stack import Stack, free_port
from workers.gateway.protocol import buffer_for

SUBQUERY_TIMEOUT_S = 60


class FailoverMissed(Exception):
    """A failover round whose trace shows no loss or no re-dispatch (said, not fatal: the
    batches measured before it are already printed)."""


def machine_busy() -> Callable[[], float]:
    """A stopwatch of the whole machine's CPU: the share of all cores busy since it began."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    busy0, total0 = sample()

    def share() -> float:
        busy1, total1 = sample()
        return (busy1 - busy0) / max(1, total1 - total0)

    return share


def cpu_s(pids: list[int], *, main_thread: bool = False) -> float:
    """CPU seconds of the processes (Linux /proc); with `main_thread`, of each one's main
    thread only (the web server's event loop, where the gateway's consumers run)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        stat = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


class Batch(NamedTuple):
    seconds: float
    failed: int
    web_s: float  # the web process's CPU
    loop_s: float  # of which its main thread's: the event loop the gateway runs in
    workers_s: float
    run_id: str


class Federation:
    """The private stack, one host per worker, and a gateway and a broker worker on each."""

    def __init__(self, args: argparse.Namespace, exits: ExitStack) -> None:
        from django.conf import settings
        from django.core.management import call_command

        from workers import services
        from workers.models import Venue

        self.args = args
        call_command("migrate", verbosity=0)
        gw, _ = Venue.objects.get_or_create(name="gw", defaults={"kind": "edge", "trusted": False})
        bk, _ = Venue.objects.get_or_create(
            name="bk", defaults={"kind": "datacenter", "trusted": True}
        )
        self.tokens = {
            v.name: services.token_create(v, ttl=timedelta(hours=2), label="bench")[1]
            for v in (gw, bk)
        }
        self.hosts = [exits.enter_context(netlab.Host()) for _ in range(args.workers)]
        self.web_port = free_port()
        self.stack = Stack(
            state_dir=Path(settings.DATA_DIR) / "stack",
            venues=[],
            env={
                "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
                "FRLM_DB_PATH": str(settings.DATABASES["default"]["NAME"]),
                # The address each host reaches the server at (its veth's far end).
                "FRLM_ALLOWED_HOSTS": ",".join(["127.0.0.1", *[h.host_ip for h in self.hosts]]),
            },
            web_port=self.web_port,
            start_redis=True,
            redis_persist=False,
        )
        exits.callback(self.stack.stop)
        if args.profile_web:
            self._profile_web(Path(args.profile_web).resolve())
        self.stack.start()
        self.redis_port = int(self.stack.redis_url.rsplit(":", 1)[1].split("/")[0])
        self.hidden = sorted({str(settings.DATA_DIR), str(Path(settings.BASE_DIR) / "var")})
        self.web = [h.forward(self.web_port, delay_ms=args.wan_ms) for h in self.hosts]
        self.redis = [h.forward(self.redis_port, delay_ms=args.wan_ms) for h in self.hosts]
        self.procs: dict[str, subprocess.Popen] = {}
        self.victim = "gw-0"  # the worker the failover rounds kill (a new name each time)
        for i in range(args.workers):
            self.start("gw", i)
            self.start("bk", i)
        self.wait_workers()

    def _profile_web(self, out: Path) -> None:
        """The web server started under bench/_profiled_web.py instead of `python -m
        daphne`, with daphne's own arguments."""
        plan = self.stack.plan

        def profiled() -> list:
            procs = plan()
            for proc in procs:
                if proc.name == "web":
                    assert proc.argv[1:3] == ["-m", "frlm_web.web_server"], proc.argv
                    shim = str(Path(__file__).with_name("_profiled_web.py"))
                    proc.argv = [proc.argv[0], shim, str(out), *proc.argv[3:]]
            return procs

        out.unlink(missing_ok=True)
        self.stack.plan = profiled  # type: ignore[method-assign]

    @contextmanager
    def profiling(self, on: bool) -> Iterator[None]:
        """The web server's profile collects while in this block (when `on`)."""
        if on:
            os.kill(self.web_pid(), signal.SIGUSR1)
        try:
            yield
        finally:
            if on:
                os.kill(self.web_pid(), signal.SIGUSR2)

    def start(self, venue: str, i: int, name: str = "") -> None:
        """A worker on host i. Each process on a host gets an empty data directory, so a
        worker started again makes a new key and needs a new name."""
        from django.conf import settings

        host = self.hosts[i]
        name = name or f"{venue}-{i}"
        home = f"{self.hidden[0]}/{name}"
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(settings.BASE_DIR),
            "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
            "FRLM_DATA_DIR": home,
            "HOME": home,
        }
        flags = ["--connect", "gateway"]
        if venue == "bk":
            # A trusted pod: it consumes the Celery queues itself, through its host's wire.
            # With the `worker` role's credentials (what frlm_broker_url prints).
            env["FRLM_REDIS_URL"] = redis_acl.role_url(
                f"redis://{host.host_ip}:{self.redis[i].port}/0", "worker", settings.SECRET_KEY
            )
            flags = ["--connect", "broker"]
        argv = [
            sys.executable,
            str(Path(settings.BASE_DIR) / "manage.py"),
            "frlm_worker",
            "--server",
            f"http://{host.host_ip}:{self.web[i].port}",
            "--token",
            self.tokens[venue],
            "--venue",
            venue,
            "--name",
            name,
            "--concurrency",
            str(self.args.slots),
            "--sim-latency-ms",
            str(self.args.latency_ms),
            *flags,
        ]
        log = open(self.stack.state_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = host.run(
            argv, env=env, hide=self.hidden, mkdirs=[home], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def wait_workers(self, timeout: float = 120) -> None:
        from frlm_web.redis_client import get_redis
        from workers.venues import live_workers

        deadline = time.monotonic() + timeout
        want = {"gw": self.args.workers, "bk": self.args.workers}
        while time.monotonic() < deadline:
            have = {v: len(live_workers(get_redis(), v)) for v in want}
            if have == want:
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SystemExit(f"worker {name} exited; see {self.stack.state_dir}/logs")
            time.sleep(0.2)
        raise SystemExit(f"workers did not come up: {have} of {want}")

    def web_pid(self) -> int:
        popen = self.stack.procs["web"].popen
        assert popen is not None
        return popen.pid

    def batch(self, venue: str, n: int) -> Batch:
        """One batch: seconds, failed, web CPU s (all, and its event loop's), workers' CPU s
        and the run's id."""
        workers = [p.pid for name, p in self.procs.items() if name.startswith(venue)]
        web = [self.web_pid()]
        before = cpu_s(web), cpu_s(web, main_thread=True), cpu_s(workers)
        run = run_to_end(
            timed_program(n, sequential=False),
            venues=[venue],
            policy={
                "max_batch": n,
                "max_subqueries": 2 * n,
                "cell_timeout_s": 3600,
                "subquery_timeout_s": SUBQUERY_TIMEOUT_S,
            },
        )
        if run.status != "succeeded":
            raise SystemExit(f"the {venue} batch failed: {run.error}")
        elapsed, failed = run.answer.split()
        return Batch(
            float(elapsed),
            int(failed),
            cpu_s(web) - before[0],
            cpu_s(web, main_thread=True) - before[1],
            cpu_s(workers) - before[2],
            str(run.id),
        )

    def failover(self, n: int) -> tuple[float, float]:
        """Kill a worker of host 0 while it holds jobs; seconds from the kill to Worker.Lost
        and to the first re-dispatch of what it held (SubQuery.Retry)."""
        from frlm_web.redis_client import get_redis
        from runs.models import Run
        from runs.services import ContextSpec, run_create, run_launch
        from traces import store
        from workers.backends import model_spec
        from workers.venues import live_workers

        run = run_create(
            question=timed_program(n, sequential=False),
            context=ContextSpec(text="benchmark"),
            policy={
                "max_batch": n,
                "max_subqueries": 2 * n,
                "subquery_timeout_s": SUBQUERY_TIMEOUT_S,
            },
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["gw"],
        )
        run_launch(run)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            entry = {w["label"]: w for w in live_workers(get_redis(), "gw")}.get(self.victim) or {}
            if entry.get("inflight", 0) > 0:
                break
            time.sleep(0.01)
        victim = self.procs.pop(self.victim)
        killed = time.time()
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        while not Run.objects.get(id=run.id).done:
            time.sleep(0.1)
        lost = retry = None
        for _ in range(100):
            events = store.read_events(run.id)
            lost = [e["ts"] for e in events if e["name"] == "Worker.Lost"]
            retry = [
                e["ts"]
                for e in events
                if e["name"] == "SubQuery.Retry" and "was lost" in e["attrs"].get("reason", "")
            ]
            if (
                lost
                and retry
                and any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events)
            ):
                break
            time.sleep(0.1)
        self.victim = f"gw-0.{len(self.procs)}{int(time.time()) % 1000}"
        self.start("gw", 0, name=self.victim)
        self.wait_workers()
        if not lost or not retry:
            raise FailoverMissed(f"run {run.id}: no Worker.Lost or re-dispatch after the kill")
        return min(lost) / 1e9 - killed, min(retry) / 1e9 - killed


def where_time_goes(run_id: str, slots: int) -> str:
    """Medians over the run's sub-queries, from its trace: publish to execution start (the
    hand-off), execution beyond the model's own time (the worker), and the model."""
    from traces import store

    events = []
    for _ in range(100):
        events = store.read_events(run_id)
        if any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events):
            break
        time.sleep(0.1)
    submits = {
        e["span_id"]: e["ts"]
        for e in events
        if e["name"] == "SubQuery.Submit" and e["phase"] == "start"
    }
    starts = {
        e["span_id"]: e for e in events if e["name"] == "SubQuery.Execute" and e["phase"] == "start"
    }
    handoff, worker, model = [], [], []
    for e in events:
        if e["name"] != "SubQuery.Execute" or e["phase"] != "end" or e["span_id"] not in starts:
            continue
        begun = starts[e["span_id"]]
        if begun["parent_id"] in submits:
            handoff.append((begun["ts"] - submits[begun["parent_id"]]) / 1e6)
        model_ms = float(e["attrs"].get("model_ms") or 0)
        model.append(model_ms)
        worker.append(float(e.get("ms") or 0) - model_ms)
    if not model:
        return "no trace"
    # A slot's refill: a worker of W slots starts its (k+W)-th job in the slot its k-th
    # finished job freed; the gap is time the slot stood idle. A gateway worker's job from
    # its buffer starts when the server hears it did (workers/gateway/protocol.py), so
    # there the gap is at most that: the slot itself was idle for less.
    refill = []
    by_worker: dict[str, tuple[list[int], list[int]]] = {}
    for e in events:
        if e["name"] == "SubQuery.Execute" and e["phase"] in ("start", "end"):
            pair = by_worker.setdefault(e["worker_id"] or "", ([], []))
            pair[0 if e["phase"] == "start" else 1].append(e["ts"])
    for starts_ts, ends_ts in by_worker.values():
        starts_ts.sort()
        ends_ts.sort()
        refill += [
            (starts_ts[k + slots] - ends_ts[k]) / 1e6
            for k in range(min(len(starts_ts) - slots, len(ends_ts)))
        ]
    first_out = min(submits.values())
    first_run = min(e["ts"] for e in starts.values())
    ends = [e for e in events if e["name"] == "SubQuery.Submit" and e["phase"] == "end"]
    last_run = max(
        e["ts"] for e in events if e["name"] == "SubQuery.Execute" and e["phase"] == "end"
    )
    last_settled = max(e["ts"] for e in ends) if ends else last_run
    shares = sorted((len(v[1]) for v in by_worker.values()), reverse=True)
    done_at = sorted((max(v[1]) - first_out) / 1e6 for v in by_worker.values() if v[1])
    finish = "/".join(f"{ms:.0f}" for ms in done_at)
    first = (first_run - first_out) / 1e6
    return (
        f"jobs per worker {'/'.join(map(str, shares))}, each done after {finish} ms; "
        f"first job out to first running {first:5.1f} ms, last running to last settled "
        f"{(last_settled - last_run) / 1e6:5.1f} ms; "
        f"(median/p90/max) hand-off {spread(handoff)} ms, worker {spread(worker)} ms, "
        f"model {spread(model)} ms, slot refill {spread(refill)} ms"
    )


def spread(values: list[float]) -> str:
    """median/p90/max of some milliseconds: a wave waits for its slowest, not its median."""
    if not values:
        return "-"
    ranked = sorted(values)
    p90 = ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]
    return f"{statistics.median(ranked):.1f}/{p90:.1f}/{ranked[-1]:.1f}"


def report(args: argparse.Namespace, n: int, floor: float, rows: dict, spent: dict) -> None:
    """The batches of `n` sub-queries: each try, then the best and median of each path."""
    slots = args.workers * args.slots
    ideal = math.ceil(n / slots) * args.latency_ms / 1000
    label = {"gw": "gateway", "bk": "broker "}
    print(f"  N={n}: ideal ceil(N/W)*L {ideal:7.3f} s")
    print(f"  harness floor (no FRLM)   {floor:7.3f} s  {floor / ideal:6.3f}x ideal")
    best = {}
    for venue in ("gw", "bk"):
        for i, b in enumerate(rows[venue], 1):
            print(
                f"  {label[venue]} try {i}         {b.seconds:7.3f} s  {b.seconds / ideal:6.3f}x "
                f"ideal  failed {b.failed}  CPU per sub-query: web {b.web_s * 1000 / n:5.2f} ms "
                f"(event loop {b.loop_s * 1000 / n:5.2f}), workers {b.workers_s * 1000 / n:5.2f} ms"
            )
        best[venue] = min(b.seconds for b in rows[venue])
        print(f"  {label[venue]} last try: {spent[venue]}")
    for venue in ("gw", "bk"):
        times = [b.seconds for b in rows[venue]]
        print(
            f"  {label[venue]} best / median  {best[venue]:7.3f} / {statistics.median(times):.3f} s"
            f"  {best[venue] / ideal:6.3f}x / {statistics.median(times) / ideal:.3f}x ideal"
            "   (target: gateway <= 1.10x)"
        )
    medians = {v: statistics.median(b.seconds for b in rows[v]) for v in rows}
    print(
        f"  gateway / broker          {best['gw'] / best['bk']:7.3f}x best, "
        f"{medians['gw'] / medians['bk']:.3f}x median   (target <= 1.05x)",
        flush=True,
    )


def print_profile(path: Path, lines: int = 30) -> None:
    """The web process's event loop over the gateway batches: top functions by own time,
    then by cumulative time."""
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the web server writes it on SIGUSR2, in its own time
    time.sleep(0.5)
    stats = pstats.Stats(str(path))
    stats.strip_dirs()
    print(f"  web server's event loop over the gateway batches ({path}):", flush=True)
    for key in ("tottime", "cumulative"):
        stats.sort_stats(key).print_stats(lines)
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", default="256", help="sub-queries per batch; a comma list measures each (64,256)"
    )
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument(
        "--workers", type=int, default=4, help="hosts; a gateway and a broker worker on each"
    )
    parser.add_argument("--slots", type=int, default=8, help="slots per worker")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--failovers", type=int, default=None, help="worker kills measured (default: --repeat)"
    )
    parser.add_argument(
        "--wan-ms", type=float, default=0.0, help="one-way delay on each host's wire"
    )
    parser.add_argument("--quick", action="store_true", help="one round: a minute or two")
    parser.add_argument(
        "--profile-web",
        metavar="FILE",
        help="profile the web server's event loop over the gateway batches (pstats to FILE)",
    )
    args = parser.parse_args()
    try:
        sizes = [int(n) for n in str(args.n).split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"--n {args.n!r}: give whole numbers separated by commas") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--n {args.n!r}: give at least one batch size of 1 or more")
    if args.quick:
        args.repeat = 1
    failover_count = args.repeat if args.failovers is None else args.failovers
    ok, why = netlab.can_create()
    if not ok:
        raise SystemExit(f"this machine cannot create network namespaces: {why}")
    stop_on_signals()

    slots = args.workers * args.slots
    print(
        f"federation benchmark: sub-queries of {args.latency_ms:.0f} ms over "
        f"{args.workers} workers x {args.slots} slots, each worker on a host of its own "
        f"(network + mount namespace), one-way delay {args.wan_ms:g} ms; a gateway worker "
        f"holds {buffer_for(args.slots, settings.FRLM_GATEWAY_BUFFER)} jobs beyond its slots "
        f"(FRLM_GATEWAY_BUFFER={settings.FRLM_GATEWAY_BUFFER:g})",
        flush=True,
    )
    with ExitStack() as exits:
        fed = Federation(args, exits)
        for venue in ("gw", "bk"):
            fed.batch(venue, slots)  # warm connections, workers and the model
        for n in sizes:
            rows: dict[str, list[Batch]] = {"gw": [], "bk": []}
            # The machine's floor: the same requests straight to a simulated model from W
            # threads in one process per host, with no FRLM at all (bench/fanout.py).
            idle = machine_busy()
            time.sleep(2)
            print(f"  machine busy while the stack idles: {idle():.0%} of its cores", flush=True)
            busy = machine_busy()
            floor = min(
                harness_floor(n, slots, args.latency_ms, procs=args.workers) for _ in range(2)
            )
            print(f"  machine busy during the floor: {busy():.0%} of its cores", flush=True)
            for i in range(args.repeat):
                order = ("gw", "bk") if i % 2 == 0 else ("bk", "gw")
                for venue in order:
                    with fed.profiling(bool(args.profile_web) and venue == "gw"):
                        rows[venue].append(fed.batch(venue, n))
            spent = {v: where_time_goes(rows[v][-1].run_id, args.slots) for v in rows}
            report(args, n, floor, rows, spent)
        if args.profile_web:
            print_profile(Path(args.profile_web))
        for i in range(1, failover_count + 1):
            try:
                lost, retry = fed.failover(max(sizes))
            except FailoverMissed as missed:
                print(f"  failover {i}: {missed}", flush=True)
                continue
            print(
                f"  failover {i}: kill -9 -> Worker.Lost {lost * 1000:6.0f} ms, -> first "
                f"re-dispatch {retry * 1000:6.0f} ms   (target < 1000 ms)",
                flush=True,
            )


if __name__ == "__main__":
    main()
