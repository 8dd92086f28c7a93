"""The console's run pages: dashboard, launcher, the run page (the execution movie), the
what-if replay and the trace diff. Who may see a run is decided once, by
`runs.selectors.visible_runs`: its owner, or staff (runs made by the CLI have no owner:
staff only)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Avg, Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from frlm_web.redis_client import get_redis
from runs.engine.progress import read_progress
from runs.forms import POLICY_FIELDS, ReplayForm, RunForm, place_errors, place_policy_errors
from runs.models import Run
from runs.program_templates import PROGRAM_TEMPLATES
from runs.sandbox import isolation_problem
from runs.selectors import visible_runs
from runs.services import (
    RunInputError,
    RunLaunchError,
    launch_notes,
    run_cancel,
    run_create,
    run_launch,
    run_replay,
)
from traces.diff import TraceDiffError, run_diff
from traces.selectors import run_worker_ids
from workers.models import Venue
from workers.selectors import worker_names
from workers.venues import live_workers

PERIODS: dict[str, timedelta] = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
RUNS_SHOWN = 100
# The dashboard's status filter: "live" is queued or running, the rest one status each.
STATUS_FILTERS: dict[str, list[str]] = {
    "live": [Run.Status.QUEUED, Run.Status.RUNNING],
    **{s.value: [s.value] for s in Run.Status if s not in (Run.Status.QUEUED, Run.Status.RUNNING)},
}


# --- who sees what -------------------------------------------------------------------------
def _get_run_for_user(request: HttpRequest, run_id: str) -> Run:
    """The run, or 404 alike for one that does not exist and one the user may not see."""
    return get_object_or_404(visible_runs(request.user), id=run_id)


def _period(request: HttpRequest) -> str:
    period = request.GET.get("period", "24h")
    return period if period in PERIODS else "24h"


# --- dashboard ----------------------------------------------------------------------------
def _run_filter(request: HttpRequest) -> dict[str, str]:
    """The dashboard's search text and status filter, as asked (an unknown status: all)."""
    status = request.GET.get("status", "")
    return {
        "q": request.GET.get("q", "").strip()[:200],
        "status": status if status in STATUS_FILTERS else "",
    }


def _run_rows(request: HttpRequest, period: str) -> list[dict[str, Any]]:
    since = timezone.now() - PERIODS[period]
    wanted = _run_filter(request)
    runs = visible_runs(request.user).filter(created__gte=since)
    if wanted["q"]:
        q = wanted["q"]
        runs = runs.filter(Q(question__icontains=q) | Q(id__icontains=q) | Q(answer__icontains=q))
    if wanted["status"]:
        runs = runs.filter(status__in=STATUS_FILTERS[wanted["status"]])
    runs = list(runs.select_related("owner").order_by("-created")[:RUNS_SHOWN])
    client = get_redis()
    now = timezone.now()
    rows = []
    for run in runs:
        progress = read_progress(client, run.id) if not run.done else {}
        wall_ms = run.wall_ms
        if not run.done and run.started is not None:  # so far: the table is polled
            wall_ms = (now - run.started).total_seconds() * 1000
        rows.append(
            {"run": run, "progress": progress, "live": not run.done, "wall": fmt_ms(wall_ms)}
        )
    return rows


def _totals(request: HttpRequest, period: str) -> dict[str, Any]:
    since = timezone.now() - PERIODS[period]
    spent_nothing = Q(replay_of__isnull=False, replay_turn__isnull=True)  # Run.exact_replay
    totals = (
        visible_runs(request.user)
        .filter(created__gte=since)
        .aggregate(
            runs=Count("id"),
            succeeded=Count("id", filter=Q(status=Run.Status.SUCCEEDED)),
            failed=Count("id", filter=Q(status=Run.Status.FAILED)),
            live=Count("id", filter=Q(status__in=[Run.Status.QUEUED, Run.Status.RUNNING])),
            # So the four add up to the runs: cancelled, or stopped at a budget (a review).
            stopped=Count("id", filter=Q(status__in=[Run.Status.CANCELLED, Run.Status.PARTIAL])),
            subqueries=Sum("subqueries"),
            subqueries_failed=Sum("subqueries_failed"),
            # What was spent: an exact replay called no model (its figures are recorded).
            tokens_in=Sum("tokens_in", filter=~spent_nothing),
            tokens_out=Sum("tokens_out", filter=~spent_nothing),
            cost=Sum("cost", filter=~spent_nothing),
            wall_ms=Avg("wall_ms"),
        )
    )
    totals["tokens_total"] = (totals["tokens_in"] or 0) + (totals["tokens_out"] or 0)
    totals["tokens"] = fmt_count(totals["tokens_total"])
    totals["wall"] = fmt_ms(totals["wall_ms"])
    return totals


def fmt_ms(ms: float | None) -> str:
    """A duration for people: 840 ms, 12.3 s, 4m 05s."""
    if ms is None:
        return "–"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(int(ms // 1000), 60)
    return f"{minutes}m {seconds:02d}s"


def fmt_count(n: float) -> str:
    """A count for people: 950, 12.4k, 3.1M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= limit:
            return f"{n / limit:.1f}{suffix}"
    return f"{n:.0f}"


@login_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    period = _period(request)
    return render(request, "runs/dashboard.html", _dashboard_context(request, period))


def _dashboard_context(request: HttpRequest, period: str) -> dict[str, Any]:
    wanted = _run_filter(request)
    return {
        "period": period,
        "periods": list(PERIODS),
        "statuses": list(STATUS_FILTERS),
        "filter": wanted,
        # What the table polls with: the same period, search and status.
        "table_query": urlencode({"period": period, **{k: v for k, v in wanted.items() if v}}),
        "rows": _run_rows(request, period),
        "totals": _totals(request, period),
    }


@login_required
@require_GET
def runs_table(request: HttpRequest) -> HttpResponse:
    """The dashboard's runs and totals, polled by htmx while the page is open."""
    return render(request, "runs/_runs.html", _dashboard_context(request, _period(request)))


# --- launcher -----------------------------------------------------------------------------
def _live_venues() -> set[str]:
    client = get_redis()
    return {v for v in Venue.objects.values_list("name", flat=True) if live_workers(client, v)}


@login_required
def run_new(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: create the run (every input checked by run_create), start
    it, and go to its page; else the form again with each error beside its field."""
    live = _live_venues()
    # Said before anyone fills the form in: runs cannot start while the sandbox cannot.
    refused = isolation_problem(settings.FRLM_SANDBOX_ISOLATION, settings.FRLM_SANDBOX_UID)
    if request.method != "POST":
        form = RunForm(user=request.user, live=live)
        ctx = {
            "form": form,
            "policy_fields": POLICY_FIELDS,
            "programs": PROGRAM_TEMPLATES,
            "sandbox_problem": refused,
        }
        return render(request, "runs/new.html", ctx)
    form = RunForm(request.POST, request.FILES, user=request.user, live=live)
    if form.is_valid():
        try:
            with transaction.atomic():
                run = run_create(
                    question=form.cleaned_data["question"],
                    context=form.context_spec(),
                    policy=form.policy(),
                    root_model=form.model("root"),
                    worker_model=form.model("worker"),
                    venues=form.cleaned_data["venues"],
                    owner=request.user,
                    program=form.cleaned_data.get("program") or "",
                )
                run_launch(run)
        except RunInputError as exc:
            place_errors(form, exc)
        except ValueError as exc:  # a model spec the backends refuse
            form.add_error(None, str(exc))
        except RunLaunchError as exc:  # what was typed is kept: send it again once it is up
            form.add_error(None, str(exc))
        else:
            for note in launch_notes(run):  # files a folder leaves out, a tier unserved
                messages.warning(request, note)
            return redirect("run", run_id=run.id)
    else:
        form.check_policy()
        form.check_task()
    ctx = {
        "form": form,
        "policy_fields": POLICY_FIELDS,
        "programs": PROGRAM_TEMPLATES,
        "sandbox_problem": refused,
    }
    return render(request, "runs/new.html", ctx, status=400)


# --- the run page -------------------------------------------------------------------------
def _compare_candidates(request: HttpRequest, run: Run) -> list[Run]:
    """Runs to diff this one with, the related first: the same question over the same
    context (or the same generated task), then whatever else is recent. The replay source
    and the replays are offered apart, above these."""
    others = visible_runs(request.user).exclude(id=run.id).exclude(replay_of=run)
    if run.replay_of_id:
        others = others.exclude(id=run.replay_of_id)
    if run.task:
        same = Q(task=run.task)
    else:
        same = Q(question=run.question, context_path=run.context_path)
    related = list(others.filter(same).order_by("-created")[:15])
    taken = {r.id for r in related}
    rest = [r for r in others.order_by("-created")[:30] if r.id not in taken]
    for r in related:
        r.related = True
    return related + rest[: max(0, 30 - len(related))]


def _run_context(request: HttpRequest, run: Run) -> dict[str, Any]:
    """What the header and its buttons show: the page renders it, and the page fetches it
    again when the run ends (so Cancel goes and Replay comes without a reload)."""
    progress = read_progress(get_redis(), run.id) if not run.done else {}
    return {
        "run": run,
        "progress": progress,
        "policy_items": [(k, run.policy[k]) for k in POLICY_FIELDS if k in run.policy],
        "replays": visible_runs(request.user).filter(replay_of=run).order_by("-created")[:10],
        "replay_form": ReplayForm(initial={"from_turn": 1 if run.turns else None}),
        "others": _compare_candidates(request, run),
    }


@login_required
@require_GET
def run_page(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _get_run_for_user(request, run_id)
    return render(request, "runs/run.html", _page_context(request, run))


def _page_context(request: HttpRequest, run: Run) -> dict[str, Any]:
    """The whole run page's: the header's, and the worker ids as the trace has them, with
    the names they registered (waterfall, views)."""
    ctx = _run_context(request, run)
    ctx["workers"] = worker_names(run_worker_ids(run.id), active=not run.done)
    return ctx


@login_required
@require_GET
def run_header(request: HttpRequest, run_id: str) -> HttpResponse:
    """The run page's header (status, answer, totals), refreshed by htmx."""
    run = _get_run_for_user(request, run_id)
    return render(request, "runs/_header.html", _run_context(request, run))


@login_required
@require_POST
def run_replay_view(request: HttpRequest, run_id: str) -> HttpResponse:
    source = _get_run_for_user(request, run_id)
    form = ReplayForm(request.POST)
    if not form.is_valid():
        return _replay_refused(request, source, form)
    try:
        with transaction.atomic():
            copy = run_replay(
                source,
                from_turn=form.cleaned_data["from_turn"],
                policy_changes=form.policy_changes() or None,
                owner=request.user,
            )
            run_launch(copy)
    except RunInputError as exc:
        # Beside its field, under the field's label; the policy's beside its settings.
        for field, message in exc.errors.items():
            if field == "policy":
                place_policy_errors(form, message)
            else:
                form.add_error(field if field in form.fields else None, message)
        return _replay_refused(request, source, form)
    except RunLaunchError as exc:
        form.add_error(None, str(exc))
        return _replay_refused(request, source, form)
    return redirect("run", run_id=copy.id)


def _replay_refused(request: HttpRequest, source: Run, form: ReplayForm) -> HttpResponse:
    """The run page again, its Replay form open with what was typed and each error beside
    it: a redirect lost both (the panel came back closed, its values reset; a review)."""
    ctx = _page_context(request, source)
    ctx.update(replay_form=form, replay_open=True)
    return render(request, "runs/run.html", ctx, status=400)


@login_required
@require_POST
def run_cancel_view(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _get_run_for_user(request, run_id)
    if not run.done:
        run_cancel(run)
        messages.info(
            request,
            "Cancellation requested: a running cell or batch stops within a second; a root "
            "model's reply under way is waited for first.",
        )
    return redirect("run", run_id=run.id)


# --- diff ---------------------------------------------------------------------------------
@login_required
@require_GET
def diff_page(request: HttpRequest) -> HttpResponse:
    """Two runs side by side: choose them, then their waterfalls on one time axis, the
    first divergence, per-node deltas and what ran on one side only."""
    runs = visible_runs(request.user).order_by("-created")
    a_id, b_id = request.GET.get("a", "").strip(), request.GET.get("b", "").strip()
    ctx: dict[str, Any] = {"choices": runs[:100], "a_id": a_id, "b_id": b_id}
    # An id that names no run the user may see comes back on the chooser, named, with what
    # was typed kept (it was Django's bare "Not Found" page, a review).
    unknown = [
        f"{side}: no run {run_id!r} that you may see; pick one from the list, or copy the "
        "id from its run page"
        for side, run_id in (("A", a_id), ("B", b_id))
        if run_id and not runs.filter(id=run_id).exists()
    ]
    if unknown:
        ctx["pick_errors"] = unknown
        return render(request, "runs/diff.html", ctx, status=404)
    if a_id and b_id:
        run_a = _get_run_for_user(request, a_id)
        run_b = _get_run_for_user(request, b_id)
        ctx.update(run_a=run_a, run_b=run_b)
        # The waterfalls name workers as the run page does (trace.js reads #run-workers).
        ids = sorted({*run_worker_ids(run_a.id), *run_worker_ids(run_b.id)})
        ctx["workers"] = worker_names(ids, active=not (run_a.done and run_b.done))
        try:
            diff = run_diff(run_a.id, run_b.id)
        except TraceDiffError as exc:
            ctx["diff_error"] = str(exc)
        else:
            ctx.update(_diff_tables(diff))
        ctx["api"] = reverse("api-diff") + f"?a={run_a.id}&b={run_b.id}"
    elif a_id:
        ctx["run_a"] = _get_run_for_user(request, a_id)
    return render(request, "runs/diff.html", ctx)


DIFF_NODES_SHOWN = 300


def _input_change(change: dict[str, Any]) -> dict[str, Any]:
    """An input that differs; for a JSON object (the policy), only the keys that differ."""
    try:
        a, b = json.loads(change["a"] or "null"), json.loads(change["b"] or "null")
    except ValueError:
        return {**change, "keys": None}
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return {**change, "keys": None}
    keys = [
        {"key": key, "a": a.get(key), "b": b.get(key)}
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    ]
    return {**change, "keys": keys}


def _diff_tables(diff: Any) -> dict[str, Any]:
    """The per-node table (in tree order; past DIFF_NODES_SHOWN, changed nodes first) and
    the one-sided lists, shaped for the template."""
    nodes = []
    for node in diff["nodes"]:
        nodes.append(
            {
                **node,
                "level": max(0, len(node["path"]) - 1),
                "tokens_delta": node["tokens_in"]["delta"] + node["tokens_out"]["delta"],
            }
        )
    shown = nodes
    if len(nodes) > DIFF_NODES_SHOWN:
        changed = [n for n in nodes if n["changed"]]
        shown = (changed + [n for n in nodes if not n["changed"]])[:DIFF_NODES_SHOWN]
    return {
        "diff": diff,
        "inputs": [_input_change(change) for change in diff["inputs"]],
        "nodes": shown,
        "nodes_hidden": len(nodes) - len(shown),
        "only_lists": [("Only in A", diff["only_in_a"]), ("Only in B", diff["only_in_b"])],
    }
