"""Venue and worker health: who is online (presence in Redis), how loaded (sub-queries in
flight over slots), and how fast and reliable recently (from the traces of the user's
latest runs).

The workers app imports nothing of runs (runs imports workers): which runs the user may
see, and when they ran, reach these views as a `run_reads` argument (RunReads) that the
URLconf passes, the way the trace views get their access rule."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from frlm_web.money import money_str
from frlm_web.redis_client import get_redis
from traces.selectors import recent_executions, worker_activity, worker_history
from traces.views import api_view
from workers import reputation
from workers.backends import SIM_WORKER_MODEL
from workers.models import Venue, Worker
from workers.pricing import payee_price
from workers.selectors import worker_names
from workers.venues import HTTP_ONLY, announced, queued

# Traces are read per segment file (about a millisecond each), so health looks at the
# latest few runs only, and keeps the answer a few seconds.
RECENT_RUNS = 10
RUNNING_RUNS = 50  # still running, whose in-flight sub-queries count towards load
WINDOW = timedelta(hours=24)
CACHE_S = 5


class WorkerHealth(TypedDict):
    name: str  # the worker id (as in traces and presence)
    label: str  # the worker's own name, where it registered one
    venue: str
    online: bool
    slots: int
    inflight: int
    load: float | None
    calls: int
    errors: int
    error_rate: float | None
    p50_ms: float | None
    p95_ms: float | None
    last_ms: float | None
    reputation: float | None  # the scheduler's score in (0, 1]; None before any evidence
    reputation_detail: dict[str, float | int | None] | None
    connection: str | None  # gateway, broker or http (takes no work), while it announces itself
    address: str | None  # where it connects from, as the gateway saw it
    rtt_ms: float | None  # the gateway's last ping round trip


class VenueHealth(TypedDict):
    name: str
    kind: str
    online: int
    slots: int
    inflight: int
    queued: int
    load: float | None
    workers: list[WorkerHealth]


class RecentRunIds(Protocol):
    """The latest `limit` ids of the runs `user` may see created since `since`, and up to
    `running_limit` ids of those still running."""

    def __call__(
        self, user: Any, *, since: datetime, limit: int, running_limit: int
    ) -> tuple[list[str], list[str]]: ...


@dataclass(frozen=True)
class RunReads:
    """What these views read of runs (runs.selectors gives both; the URLconf passes them)."""

    recent_ids: RecentRunIds
    # When the earliest of the runs started and the latest ended; None if none started.
    started_bounds: Callable[[list[str]], tuple[datetime, datetime] | None]


def _recent(request: HttpRequest, run_reads: RunReads) -> tuple[list[str], list[str]]:
    return run_reads.recent_ids(
        request.user,
        since=timezone.now() - WINDOW,
        limit=RECENT_RUNS,
        running_limit=RUNNING_RUNS,
    )


def _cached(kind: str, ids: list[str], compute: Any) -> Any:
    key = f"frlm:health:{kind}:" + hashlib.sha256(",".join(ids).encode()).hexdigest()[:24]
    value = cache.get(key)
    if value is None:
        value = compute()
        cache.set(key, value, CACHE_S)
    return value


def venue_health(recent: list[str], running: list[str]) -> list[VenueHealth]:
    """Every known venue with its workers: those announcing themselves now, and those
    seen in the given runs' traces that no longer do (offline)."""
    activity = _cached(
        "activity", recent + ["|"] + running, lambda: worker_activity(recent, running)
    )
    client = get_redis()
    labels = dict(Worker.objects.filter(id__in=list(activity)).values_list("id", "name"))
    out: list[VenueHealth] = []
    for venue in Venue.objects.all():
        workers: list[WorkerHealth] = []
        seen: set[str] = set()
        for info in announced(client, venue.name):
            name = str(info.get("name"))
            seen.add(name)
            # One that takes no work (it beats over HTTP only) is shown, with no slots.
            usable = info.get("connection") != HTTP_ONLY
            slots = int(info.get("concurrency", 1)) if usable else 0
            worker = _worker(name, venue.name, True, slots, activity)
            worker["label"] = str(info.get("label") or name)
            worker["connection"] = info.get("connection") or "broker"
            worker["address"] = info.get("address") or None
            worker["rtt_ms"] = info.get("rtt_ms")
            workers.append(worker)
        for name, figures in sorted(activity.items()):
            if figures.get("venue") == venue.name and name not in seen:
                worker = _worker(name, venue.name, False, 0, activity)
                worker["label"] = labels.get(name, name)
                workers.append(worker)
        _add_reputation(client, workers)
        slots = sum(w["slots"] for w in workers)
        inflight = sum(w["inflight"] for w in workers)
        out.append(
            {
                "name": venue.name,
                "kind": venue.get_kind_display(),
                "online": sum(1 for w in workers if w["online"]),
                "slots": slots,
                "inflight": inflight,
                "queued": queued(client, venue.name),
                "load": inflight / slots if slots else None,
                "workers": workers,
            }
        )
    return out


def _add_reputation(client: Any, workers: list[WorkerHealth]) -> None:
    """Each worker's reputation from Redis (workers.reputation, one round trip), where it
    has seen it work: a score of 1 before any evidence says nothing, so it is left out."""
    reps = reputation.load(client, [w["name"] for w in workers])
    for worker in workers:
        rep = reps.get(worker["name"])
        if rep is not None and (rep.samples or rep.strikes):
            worker["reputation"] = round(rep.score, 3)
            worker["reputation_detail"] = rep.as_dict()


def _worker(
    name: str, venue: str, online: bool, slots: int, activity: dict[str, Any]
) -> WorkerHealth:
    figures = activity.get(name) or {}
    calls, errors = int(figures.get("calls") or 0), int(figures.get("errors") or 0)
    inflight = int(figures.get("inflight") or 0) if online else 0
    return {
        "name": name,
        "label": name,
        "venue": venue,
        "online": online,
        "slots": slots,
        "inflight": inflight,
        "load": inflight / slots if slots else None,
        "calls": calls,
        "errors": errors,
        "error_rate": errors / calls if calls else None,
        "p50_ms": figures.get("p50_ms"),
        "p95_ms": figures.get("p95_ms"),
        "last_ms": figures.get("last_ms"),
        "reputation": None,
        "reputation_detail": None,
        "connection": None,
        "address": None,
        "rtt_ms": None,
    }


@login_required
@require_GET
def venues_panel(request: HttpRequest, *, run_reads: RunReads) -> HttpResponse:
    """The dashboard's venue and worker health, polled by htmx."""
    recent, running = _recent(request, run_reads)
    venues = venue_health(recent, running)
    # Online workers only, the others counted: every restart leaves an offline registration
    # behind, and the panel had piled up 27 of them (a review); the venues page has them.
    panel = [
        {
            **venue,
            "workers": [w for w in venue["workers"] if w["online"]],
            "offline": sum(1 for w in venue["workers"] if not w["online"]),
        }
        for venue in venues
    ]
    return render(request, "workers/_health.html", {"venues": panel, "runs_read": len(recent)})


@login_required
@require_GET
def venues_page(request: HttpRequest, *, run_reads: RunReads) -> HttpResponse:
    recent, running = _recent(request, run_reads)
    executions = _cached("recent", recent, lambda: recent_executions(recent))
    venues = venue_health(recent, running)
    for venue in venues:
        for worker in venue["workers"]:
            worker["recent"] = executions.get(worker["name"], [])  # type: ignore[typeddict-unknown-key]
    ctx = {
        "venues": venues,
        "runs_read": len(recent),
        "window_h": int(WINDOW.total_seconds() // 3600),
    }
    return render(request, "workers/venues.html", ctx)


WORKER_RECENT = 100  # sub-queries listed on a worker's page


@login_required
@require_GET
def worker_page(request: HttpRequest, worker_id: str, *, run_reads: RunReads) -> HttpResponse:
    """One worker: who it is (registration, presence, reputation), its recent sub-queries
    in the runs the user may see, and its latency and error history. Workers are shared
    infrastructure: any signed-in user sees a worker, never runs that are not theirs."""
    recent, running = _recent(request, run_reads)
    registered = Worker.objects.select_related("venue").filter(id=worker_id).first()
    found: WorkerHealth | None = None
    for venue in venue_health(recent, running):
        for worker in venue["workers"]:
            if worker["name"] == worker_id:
                found = worker
    if found is None:
        if registered is None:
            raise Http404(f"no worker {worker_id!r}")
        # Registered, but neither announcing itself nor seen in the user's recent runs.
        found = _worker(worker_id, registered.venue.name, False, 0, {})
        found["label"] = registered.name
        _add_reputation(get_redis(), [found])
    executions = recent_executions(recent, per_worker=WORKER_RECENT).get(worker_id, [])
    ctx = {
        "worker": found,
        "registered": registered,
        "prices": _price_shown(registered) if registered else None,
        "recent": executions,
        "runs_read": len(recent),
        "window_h": int(WINDOW.total_seconds() // 3600),
    }
    return render(request, "workers/worker.html", ctx)


class PriceShown(TypedDict):
    model: str  # "" for the worker's own price, which holds for every model
    per_1k_in: str | None  # money strings; None: no price known, its replies not paid
    per_1k_out: str | None
    source: str


def _price_shown(worker: Worker) -> list[PriceShown]:
    """The prices a run pays the worker at, as runs.trust.accounts.price_of prices a reply:
    its own when it announced one; else, per model it serves, that model's list price (a
    job is priced at the model it asks for); a worker serving any model is paid the list
    price of the model a job asks, the simulated worker model's shown for an example. The
    page showed the announced "$0 / $0" of a worker whose receipts charged its model's list
    price (a review). Money as spelt elsewhere: "0.1", not the column's "0.100000000000"."""
    own = bool(worker.price_in or worker.price_out)  # the same for every model
    shown: list[PriceShown] = []
    for model in [""] if own else worker.models_served or [SIM_WORKER_MODEL]:
        paid = payee_price(worker.price_in, worker.price_out, model)
        source = "" if own else paid.source if paid else "no price list knows it: set FRLM_PRICES"
        if not own and not worker.models_served:
            source = f"for a job that asks for it; any model's list price: {source}"
        shown.append(
            PriceShown(
                model=model,
                per_1k_in=money_str(paid.per_1k_in) if paid else None,
                per_1k_out=money_str(paid.per_1k_out) if paid else None,
                source=source,
            )
        )
    return shown


@api_view
def venues_history(request: HttpRequest, *, run_reads: RunReads) -> JsonResponse:
    """Latency (p50, p95) and error rate per worker over time, for the venue page's chart
    (and one worker's page, with `?worker=<id>`)."""
    recent, _ = _recent(request, run_reads)
    rows = _cached(
        "history",
        recent,
        lambda: worker_history(recent, bucket_s=_bucket_s(recent, run_reads)),
    )
    only = request.GET.get("worker")
    series: dict[str, dict[str, list]] = {}
    for row in rows:
        if only and row["worker_id"] != only:
            continue
        s = series.setdefault(
            row["worker_id"],
            {"t_ms": [], "p50_ms": [], "p95_ms": [], "error_rate": [], "calls": []},
        )
        s["t_ms"].append(row["t_ms"])
        s["p50_ms"].append(row["p50_ms"])
        s["p95_ms"].append(row["p95_ms"])
        s["calls"].append(row["calls"])
        s["error_rate"].append(row["errors"] / row["calls"] if row["calls"] else 0)
    # The legend names each worker as it registered, and says which ones have departed.
    return JsonResponse({"workers": series, "names": worker_names(series), "runs": len(recent)})


NAMES_PER_ASK = 200  # ids in one ?id= look-up (a live batch's new workers)


@api_view
def worker_names_json(request: HttpRequest) -> JsonResponse:
    """{workers: {id: {name, venue, departed}}} for `?id=` ids: the run page asks when a
    live event names a worker it has not met. Workers are shared infrastructure: any
    signed-in user may see one (as on the venues page)."""
    ids = request.GET.getlist("id")
    if len(ids) > NAMES_PER_ASK:
        return JsonResponse({"error": f"ask for at most {NAMES_PER_ASK} ids at once"}, status=400)
    return JsonResponse({"workers": worker_names(ids)})


def _bucket_s(run_ids: list[str], run_reads: RunReads) -> int:
    """Buckets of about a sixtieth of the time the runs span (at least a second)."""
    bounds = run_reads.started_bounds(run_ids)
    if bounds is None:
        return 60
    first, last = bounds
    span = (last - first).total_seconds()
    return max(1, int(span / 60))
