"""What the run commands (frlm_run, frlm_replay) share: the checks before a run is made,
handing it over, waiting with a progress bar (Ctrl-C or SIGTERM cancels the run), and the
summary of a finished run."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from django.core.management.base import CommandError

from frlm_web.money import money, money_str
from frlm_web.redis_client import OUTAGE_ERRORS, get_redis
from runs.engine.progress import read_progress
from runs.lease import leases_reap
from runs.models import Run, lost_workers_in
from runs.orphans import conductor_gone, runs_fail_orphaned
from runs.services import RunLaunchError, run_cancel, run_launch
from runs.taskgen import answer_score


def refuse_unless_ready() -> None:
    """Before a run is made: Redis answers and a conductor is there to take the run, so
    that no run is left queued for nobody while the command waits its whole --timeout."""
    from frlm_web import presence
    from frlm_web.redis_client import redis_available
    from runs.orphans import CONDUCTOR_GROUP

    if not redis_available():
        raise CommandError("Redis is not reachable at FRLM_REDIS_URL; start it with `make up`")
    if not presence.alive(get_redis(), CONDUCTOR_GROUP):
        raise CommandError(
            "no conductor is running; start everything with `make up` (or "
            "`python manage.py frlm_conductor`)"
        )


def launch(run: Run) -> None:
    """Hand the run to a conductor; one the broker does not take is failed, and said."""
    try:
        run_launch(run)
    except RunLaunchError as exc:
        raise CommandError(str(exc)) from None


def watch(run: Run, timeout: float, *, show: bool) -> Run:
    """wait_for, where Ctrl-C, and SIGTERM (a `timeout`, a CI job cancelled, a closed
    terminal), cancel the run: it would otherwise go on spending with nobody waiting."""
    main = threading.current_thread() is threading.main_thread()  # (call_command elsewhere)
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        return wait_for(run, timeout, show=show)
    except KeyboardInterrupt:
        run_cancel(run)
        raise CommandError(f"cancelled run {run.id}") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def wait_for(run: Run, timeout: float, *, show: bool) -> Run:
    """Wait until the run ends, drawing progress on stderr; cancel it past `timeout`."""
    client = get_redis()
    bar = ProgressBar(sys.stderr) if show else None
    started = time.monotonic()
    deadline = started + timeout
    checked = time.monotonic()
    rows = Run.objects.filter(id=run.id)
    while True:
        # Two columns while it runs: the whole row (its accounts, its answer) is a hundred
        # times the work, and a short run's waiting must not take CPU from its conductor.
        status, conductor = rows.values_list("status", "conductor").get()
        run.status, run.conductor = status, conductor
        if run.done:
            run.refresh_from_db()
        try:
            if not run.done and run.conductor and time.monotonic() - checked > 2:
                checked = time.monotonic()
                leases_reap(client, by="frlm_run")
                if conductor_gone(run.conductor):
                    runs_fail_orphaned()
                    continue
            if run.done:
                if bar:
                    bar.close(read_progress(client, run.id), run.status)
                return run
            if bar:
                bar.draw(read_progress(client, run.id), run.status)
        except OUTAGE_ERRORS:
            # Redis restarting: the run goes on; its outcome is in the database.
            if run.done:
                return run
        if time.monotonic() > deadline:
            run_cancel(run)
            raise CommandError(f"run {run.id} gave no answer within {timeout:g} s; cancelled it")
        # Often at first, when a short run (a replay) is likely to end; then 5 a second.
        time.sleep(0.05 if time.monotonic() - started < 10 else 0.2)


class ProgressBar:
    """One line, redrawn in place on a terminal; a line every few seconds elsewhere."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.last_line = 0.0

    def render(self, progress: dict[str, str], status: str) -> str:
        total = int(progress.get("subqueries", 0))
        done = int(progress.get("settled", 0))
        width = 24
        filled = int(width * done / total) if total else 0
        bar = "#" * filled + "-" * (width - filled)
        phase = progress.get("phase", status)
        return (
            f"[{bar}] {done}/{total} sub-queries  {phase:<10}  "
            f"{int(progress.get('tokens', 0)):>9} tok  ${float(progress.get('cost', 0)):.4f}  "
            f"{time.monotonic() - self.started:6.1f}s"
        )

    def draw(self, progress: dict[str, str], status: str) -> None:
        line = self.render(progress, status)
        if self.tty:
            self.stream.write("\r" + line)
            self.stream.flush()
        elif time.monotonic() - self.last_line > 5:
            self.stream.write(line + "\n")
            self.last_line = time.monotonic()

    def close(self, progress: dict[str, str], status: str) -> None:
        self.stream.write(("\r" if self.tty else "") + self.render(progress, status) + "\n")
        self.stream.flush()


def summarise(run: Run) -> dict[str, Any]:
    simulated = [
        role
        for role, spec in (("root", run.root_model), ("worker", run.worker_model))
        if spec.get("kind") == "sim"
    ]
    return {
        "run_id": run.id,
        "status": run.status,
        "question": run.question,
        "program": run.program or None,
        "answer": run.answer,
        "expected_answer": run.expected_answer or None,
        "correct": run.correct,
        "score": (
            round(answer_score(run.task, run.expected_answer, run.answer), 4)
            if run.expected_answer and run.status in (Run.Status.SUCCEEDED, Run.Status.PARTIAL)
            else None
        ),
        "error": run.error or None,
        "wall_s": round((run.wall_ms or 0) / 1000, 3),
        "turns": run.turns,
        "subqueries": run.subqueries,
        "subqueries_failed": run.subqueries_failed,
        "subqueries_cut": run.subqueries_cut,
        "subqueries_cancelled": run.subqueries_cancelled,
        "tokens_in": run.tokens_in,
        "tokens_out": run.tokens_out,
        "cost_usd": money_str(run.cost),  # exact dollars as a decimal string
        "venues": run.venues,
        "root_model": run.root_model.get("model"),
        "worker_model": run.worker_model.get("model"),
        "simulated": bool(simulated),
        "simulated_roles": simulated,
        "exact_replay": run.exact_replay,  # its tokens and cost are the recording's
        "isolation": run.isolation,
        "replay_of": run.replay_of_id,
        "replay_turn": run.replay_turn,
        "accounts": run.accounts or None,
        "prices": run.price_sources,  # model -> where its price comes from
    }


def _simulated_note(roles: list[str]) -> str:
    """Which of the cost is the simulated model's nominal prices: a run with a real root
    model and simulated workers said "simulated model" of the whole (a review)."""
    if len(roles) == 2:
        return "  (simulated model: nominal prices)"
    if roles:
        return f"  (its simulated {roles[0]} model's part at nominal prices)"
    return ""


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"run        {s['run_id']}  ({s['status']})"]
    if s["error"]:
        lines.append(f"error      {s['error']}")
    lines.append(f"answer     {s['answer'] or '-'}")
    if s["expected_answer"] is not None:
        verdict = {True: "yes", False: "NO", None: "-"}[s["correct"]]
        lines.append(f"expected   {s['expected_answer']}   match: {verdict}")
        if s.get("score") is not None:
            lines.append(f"score      {s['score']:.4f}")
    lines.append(
        f"wall       {s['wall_s']:.2f} s   turns {s['turns']}   sub-queries {s['subqueries']} "
        f"({s['subqueries_failed']} failed"
        + (f", {s['subqueries_cut']} cut off at the quorum" if s.get("subqueries_cut") else "")
        + (
            f", {s['subqueries_cancelled']} cancelled with the run"
            if s.get("subqueries_cancelled")
            else ""
        )
        + ")"
    )
    lines.append(
        f"tokens     {s['tokens_in']} in / {s['tokens_out']} out   "
        f"cost ${money(s['cost_usd']):.4f}"
        + (
            "  (recorded: this replay called no model and spent nothing)"
            if s.get("exact_replay")
            else _simulated_note(s.get("simulated_roles", []))
        )
    )
    lines.append("prices     " + "; ".join(f"{m}: {src}" for m, src in s["prices"].items()))
    lines.append(
        f"models     root {s['root_model']}, workers {s['worker_model']} "
        f"on {', '.join(s['venues'])}"
    )
    if s.get("program"):
        lines.append(f"program    {s['program']} (a program template the root model ran)")
    lines.extend(_accounts_lines(s.get("accounts"), s["run_id"]))
    if s.get("replay_of"):
        turn = s["replay_turn"]
        how = (
            "all of it"
            if turn is None
            else "none of it, live from its first root turn"
            if turn == 0
            else f"root turns 1-{turn}, live after"
        )
        lines.append(f"replay of  {s['replay_of']} (from its cassette: {how})")
    lines.append(f"sandbox    {s['isolation'] or '-'}")
    if (s["isolation"] or "").startswith("NOT ISOLATED"):
        lines.append(
            "WARNING    the REPL ran WITHOUT A SANDBOX (FRLM_SANDBOX_ISOLATION=none): its code "
            "could read this machine's files, secrets and network"
        )
    lines.append(f"trace      python manage.py frlm_trace {s['run_id']}")
    return "\n".join(lines)


def _accounts_lines(accounts: dict[str, Any] | None, run_id: str) -> list[str]:
    """Verification share, budget and receipts, where the run has them."""
    if not accounts:
        return []
    lines = []
    v = accounts.get("verification") or {}
    if v.get("extra"):
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(v.get("by_kind", {}).items()))
        lines.append(
            f"verify     {v['extra']} extra sub-queries ({kinds}): {100 * v['share']:.1f}% of "
            f"all, {100 * v['overhead']:.1f}% over the {v['primary']} asked"
        )
    run = (accounts.get("budget") or {}).get("run") or {}
    if run.get("cap") and money(run["cap"]):
        settled, cap = money(run["settled"]), money(run["cap"])
        lines.append(
            f"budget     ${settled:.4f} of ${cap:.4f} ({100 * settled / cap:.0f}%)"
            + ("  reached: dispatching stopped" if accounts.get("exhausted") else "")
        )
    if accounts.get("hedges"):
        lines.append(f"hedged     {accounts['hedges']} stragglers sent to a second worker")
    lines.extend(f"lost       {w['text']}" for w in lost_workers_in(accounts))
    r = accounts.get("receipts") or {}
    if r.get("count"):
        verdicts = ", ".join(f"{n} {k}" for k, n in sorted(r.get("verdicts", {}).items()))
        # The verdicts are the replies'; the chain is checked by frlm_receipts, not here.
        lines.append(
            f"receipts   {r['count']} issued (replies {verdicts}), paid ${money(r['paid']):.4f} "
            f"of ${money(r['cost']):.4f} claimed"
        )
        lines.append(
            f"           chain {str(r.get('head'))[:16]}..., not checked here: "
            f"manage.py frlm_receipts verify {run_id}"
        )
    return lines
