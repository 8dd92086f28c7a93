"""What an experiment's report measures from the stored traces of its runs (through
`traces.selectors.runs_events`, one DuckDB scan over the suite): each run's latency
breakdown, its spending over time, the routing decisions with the reputation they saw,
and the verifiers' verdicts on each worker's replies, set against which workers the
suite's federation made lie."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs.experiments.suite import profile_toml
from traces.selectors import runs_events
from workers.models import Worker
from workers.swarm import ProfileFileError, SwarmProfile, devices, profile_load

NAMES = [
    "Run.Init",
    "Run.Decode",
    "SubQuery.Submit",
    "SubQuery.Execute",
    "SubQuery.Return",
    "Verify.Redundant",
    "Verify.Objective",
    "Verify.Attest",
    "Verify.Probe",
    "Budget.Settle",
]
# A moment of a run's wall clock counts once, for the first of these that is busy then.
RAIL = ("root", "model", "queue", "verify", "other")
COPY_KINDS = {"replica", "validator", "recheck"}


@dataclass
class RunTrace:
    """One run's events of the kinds the report reads, in time order."""

    run_id: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def spans(self, name: str) -> dict[str, dict[str, Any]]:
        """span id -> {start, end, start_attrs, end_event} for the spans of `name`."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.events:
            if e["name"] != name:
                continue
            span = out.setdefault(e["span_id"], {"start": None, "end": None})
            if e["phase"] == "start":
                span.update(start=e["ts"], start_event=e)
            elif e["phase"] == "end":
                span.update(end=e["ts"], end_event=e)
        return {k: v for k, v in out.items() if v["start"] is not None and v["end"] is not None}

    def bounds(self) -> tuple[int, int] | None:
        init = self.spans("Run.Init")
        if init:
            span = next(iter(init.values()))
            return span["start"], span["end"]
        if not self.events:
            return None
        return self.events[0]["ts"], self.events[-1]["ts"]


def load_traces(run_ids: list[str]) -> dict[str, RunTrace]:
    traces = {run_id: RunTrace(run_id) for run_id in run_ids}
    for event in runs_events(run_ids, NAMES):
        traces[event["run_id"]].events.append(event)
    return traces


# --- Figure 1: where a run's wall clock went -------------------------------------------------


def _intervals(trace: RunTrace) -> dict[str, list[tuple[int, int]]]:
    """Each rail category's busy intervals: the root model's turns, the workers' model
    calls, a job's wait from its submission to its worker starting it, and the copies that
    verification sent (replicas, validators' re-runs, re-checks)."""
    out: dict[str, list[tuple[int, int]]] = {k: [] for k in RAIL if k != "other"}
    out["root"] = [(s["start"], s["end"]) for s in trace.spans("Run.Decode").values()]
    submits = trace.spans("SubQuery.Submit")
    started = {}
    for span in trace.spans("SubQuery.Execute").values():
        parent = span["start_event"]["parent_id"]
        started[parent] = min(started.get(parent, span["start"]), span["start"])
        copy = submits.get(parent, {}).get("start_event", {}).get("attrs", {}).get("copy")
        out["verify" if copy in COPY_KINDS else "model"].append((span["start"], span["end"]))
    for span_id, span in submits.items():
        copy = span["start_event"]["attrs"].get("copy")
        if copy in COPY_KINDS:
            out["verify"].append((span["start"], span["end"]))
        else:
            out["queue"].append((span["start"], started.get(span_id, span["end"])))
    return out


def rail_ms(trace: RunTrace) -> dict[str, float] | None:
    """The run's wall clock cut into RAIL categories (ms) that add up to it: each moment
    goes to the first category busy then, and a moment none is busy to `other` (the REPL,
    the conductor's own work)."""
    bounds = trace.bounds()
    if bounds is None:
        return None
    t0, t1 = bounds
    intervals = _intervals(trace)
    cuts = sorted({t0, t1, *(t for ivs in intervals.values() for iv in ivs for t in iv)})
    cuts = [t for t in cuts if t0 <= t <= t1]
    totals = dict.fromkeys(RAIL, 0.0)
    for a, b in zip(cuts, cuts[1:], strict=False):
        middle = (a + b) / 2
        owner = next(
            (k for k in RAIL[:-1] if any(s <= middle < e for s, e in intervals[k])), "other"
        )
        totals[owner] += (b - a) / 1e6
    return totals


# --- Figure 2: spending over the run's time --------------------------------------------------

GRID = 21


def budget_curve(trace: RunTrace, cap: float | None) -> list[float] | None:
    """The share of its budget the run had spent at each of GRID evenly spaced moments of
    its wall clock: of its cap when it had one, else of what it spent in the end. Spending
    is what the run paid, when it paid it: each root turn's cost and each settled
    sub-query's (its Submit span's end). A worker's Execute span says what the worker
    claims, up to $1,000,000 (workers/gateway/relay.py), which nobody pays: summed, one
    run that paid $0.0002 of a $0.01 cap was drawn at 10^8 times its cap (a review)."""
    bounds = trace.bounds()
    if bounds is None:
        return None
    t0, t1 = bounds
    costs = sorted(
        (e["ts"], float(e["cost"] or 0))
        for e in trace.events
        if e["phase"] == "end" and e["name"] in ("Run.Decode", "SubQuery.Submit")
    )
    total = sum(c for _, c in costs)
    whole = cap if cap else total
    if not whole:
        return None
    curve = []
    for i in range(GRID):
        at = t0 + (t1 - t0) * i / (GRID - 1)
        curve.append(sum(c for ts, c in costs if ts <= at) / whole)
    return curve


# --- Figure 3: routing and the reputation it saw -------------------------------------------


def routing_decisions(traces: Iterable[RunTrace]) -> list[dict[str, Any]]:
    """Every first-attempt dispatch the router scored, in time order: when, which worker,
    and the reputation the scheduler used for it."""
    out = []
    for trace in traces:
        for e in trace.events:
            if e["name"] != "SubQuery.Submit" or e["phase"] != "start":
                continue
            routing = e["attrs"].get("routing") or {}
            worker = routing.get("worker") or e["worker_id"]
            if not worker:
                continue
            out.append(
                {
                    "ts": e["ts"],
                    "run_id": trace.run_id,
                    "worker": worker,
                    "reputation": routing.get("reputation"),
                    "copy": e["attrs"].get("copy"),
                }
            )
    return sorted(out, key=lambda d: d["ts"])


# --- Table 4: verdicts on liars and honest workers --------------------------------------


def _listed(federation: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for key in ("venues", "swarms"):
        value = federation.get(key)
        if isinstance(value, list):
            entries += [v for v in value if isinstance(v, dict)]
        elif isinstance(value, dict):
            entries += [{"name": k, **v} for k, v in value.items() if isinstance(v, dict)]
    return entries


def _profile(entry: dict[str, Any], base: Path | None) -> SwarmProfile | None:
    """The entry's swarm profile. A table given in the suite is read from the file the
    runner wrote for its swarm in the output directory (its devices are named, and its
    liars drawn, after that file's name), or written as the runner writes it
    (`profiles/<venue>.toml`) when it is gone; a shipped profile's name or a .toml path is
    loaded as it is."""
    profile, venue = entry.get("profile"), str(entry.get("name") or entry.get("venue") or "")
    try:
        if isinstance(profile, dict):
            folder = base / "profiles" if base else None
            for written in (f"{venue}.toml", f"{venue}/profile.toml"):
                if folder is not None and (folder / written).is_file():
                    return profile_load(str(folder / written))
            with tempfile.TemporaryDirectory() as scratch:
                path = Path(scratch) / f"{venue}.toml"
                path.write_text(profile_toml(profile, venue))
                return profile_load(str(path))
        if isinstance(profile, str) and profile:
            if base is not None and (base / profile).exists():
                profile = str(base / profile)
            return profile_load(profile)
    except (ProfileFileError, OSError, ValueError):
        return None
    return None


def _entry_liars(entry: dict[str, Any], base: Path | None) -> dict[str, str]:
    """name -> "lying" or "colluding" for an entry's dishonest workers: listed in it, or
    drawn as its swarm draws them (workers.swarm.devices: the same for the same profile,
    venue, count and seed; the stack starts a suite's swarms with seed 0)."""
    listed = {str(n): "lying" for n in entry.get("liars") or []}
    listed |= {str(n): "colluding" for n in entry.get("colluders") or []}
    if listed:
        return listed
    venue, count = entry.get("name") or entry.get("venue"), entry.get("workers")
    loaded = _profile(entry, base)
    if loaded is None or not venue or not isinstance(count, int):
        return {}
    kind = "colluding" if loaded.collude > 0 else "lying"
    drawn = devices(loaded, str(venue), count, int(entry.get("seed", 0)))
    return {d.name: kind for d in drawn if d.liar}


def dishonest_workers(suite: dict[str, Any], base: Path | None = None) -> dict[str, str]:
    """worker name -> "colluding" or "lying", for the workers the suite's federation made
    dishonest (every other worker is honest)."""
    federation = suite.get("federation") or {}
    out: dict[str, str] = {}
    for entry in _listed(federation):
        out |= _entry_liars(entry, base)
    for name in federation.get("liars") or []:
        out.setdefault(str(name), "lying")
    for name in federation.get("colluders") or []:
        out[str(name)] = "colluding"
    return out


def worker_names(ids: Iterable[str]) -> dict[str, str]:
    """worker id -> its registered name (events carry ids; the federation names workers)."""
    return dict(Worker.objects.filter(id__in=set(ids)).values_list("id", "name"))


def trusted_workers(ids: Iterable[str]) -> set[str]:
    """The ids among `ids` of workers on trusted venues (the validators and datacenter pods
    the verifiers take on trust: no verdict on them says anything about catching liars)."""
    return set(
        Worker.objects.filter(id__in=set(ids), venue__trusted=True).values_list("id", flat=True)
    )


def verdicts(trace: RunTrace) -> list[tuple[str, bool, str]]:
    """(worker id, accepted, verifier) for each verdict a verifier passed on one worker's
    reply. verifier is "redundancy" (agreed: accepted, outvoted: not; an unresolved vote
    accepts nobody's reply), "check" (an objective check), "attestation" (a validator's
    signed verdict on the judged worker; a refused attestation or a validator that gave no
    answer judges nobody's reply) or "probe" (a known-answer question)."""
    out: list[tuple[str, bool, str]] = []
    for e in trace.events:
        attrs = e["attrs"]
        if e["name"] == "Verify.Redundant":
            if attrs.get("outcome") == "accept":
                out += [(w, True, "redundancy") for w in attrs.get("agreed") or []]
                out += [(w, False, "redundancy") for w in attrs.get("disagreed") or []]
            else:
                out += [(w, False, "redundancy") for g in attrs.get("groups") or [] for w in g]
        elif e["name"] == "Verify.Objective" and e["worker_id"]:
            out.append((e["worker_id"], e["status"] == "ok", "check"))
        elif e["name"] == "Verify.Attest" and e["worker_id"] and "attestation" in attrs:
            out.append((e["worker_id"], e["status"] == "ok", "attestation"))
        elif e["name"] == "Verify.Probe" and e["worker_id"]:
            out.append((e["worker_id"], e["status"] == "ok", "probe"))
    return out


def rejected_returns(trace: RunTrace) -> dict[str, int]:
    """Results refused at intake (wrong sender, bad signature: each a strike), per worker."""
    counts: dict[str, int] = defaultdict(int)
    for e in trace.events:
        if e["name"] == "SubQuery.Return" and e["status"] == "rejected" and e["worker_id"]:
            counts[e["worker_id"]] += 1
    return dict(counts)
