"""Writes on runs: create (with every input checked), launch, cancel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from frlm_web.redis_client import OUTAGE_ERRORS, get_redis
from runs.engine import context as ctx
from runs.engine.policy import Policy, PolicyError
from runs.engine.progress import request_cancel
from runs.models import Run
from runs.program_templates import program_question
from runs.sandbox import isolation_problem
from runs.taskgen import make_task
from traces import store
from workers.backends import ModelSpec, cassette_spec
from workers.models import Venue
from workers.venues import live_workers

CONDUCT_TASK = "runs.conduct"  # runs.tasks.run_conduct's registered name
# A question longer than this is refused: a 2,000,000-character one (a review) was
# accepted, and its run page never finished loading in Chromium. Long material is context.
QUESTION_MAX_CHARS = 100_000


class RunInputError(ValueError):
    """Bad input for a run; `errors` maps each field to what is wrong with it."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class RunLaunchError(RuntimeError):
    """The run could not be handed to a conductor (the broker, Redis, did not take it); the
    run is failed with the reason, not left queued for nobody."""


@dataclass(frozen=True)
class ContextSpec:
    """Exactly one of: text, a path on the server, a generated task."""

    text: str | None = None
    path: str | None = None
    task: str | None = None
    tokens: int = 0
    seed: int = 0


def run_create(
    *,
    question: str,
    context: ContextSpec,
    policy: dict[str, Any] | None = None,
    root_model: ModelSpec,
    worker_model: ModelSpec,
    venues: list[str],
    owner: Any = None,
    program: str = "",
) -> Run:
    """1. check every input and report all problems at once, 2. put the context where the
    REPL can read it, 3. save the run as queued. Nothing is saved when anything is wrong.
    ``program`` names a program template (runs.program_templates) the question is run with."""
    errors: dict[str, str] = _check_sandbox()
    run = Run(
        # A browser sends a textarea's lines ended by CRLF: the same question from the
        # launcher and from frlm_run is the same text (a ```repl block typed in the
        # launcher failed where the command line's ran, a review).
        question=(question or "").replace("\r\n", "\n").replace("\r", "\n").strip(),
        root_model=root_model.to_dict(),
        worker_model=worker_model.to_dict(),
        owner=owner,
    )
    try:
        run.policy = Policy.from_dict(policy).to_dict()
    except PolicyError as exc:
        errors["policy"] = str(exc)
    errors.update(_check_venues(venues))
    run.venues = venues

    task = None
    if context.task:
        try:
            task = make_task(context.task, context.tokens, context.seed)
        except ValueError as exc:
            errors["task"] = str(exc)
        else:
            # A question of the user's own over a task's context has no known answer: the
            # task's expected answer is for the task's question (a review found a run
            # scored 0 against a question it was never asked).
            asks_own = bool(run.question.strip()) and run.question.strip() != task.question
            run.question = run.question or task.question
    elif context.path is not None:
        try:
            path = ctx.check_path(context.path)
        except ctx.ContextError as exc:
            errors["context"] = str(exc)
    elif context.text is not None:
        if not context.text.strip():
            errors["context"] = "the context text is empty"
    else:
        errors["context"] = "give a context: a file or folder path, text, or a generated task"
    if len(run.question) > QUESTION_MAX_CHARS:
        errors["question"] = (
            f"the question is {len(run.question):,} characters, more than the "
            f"{QUESTION_MAX_CHARS:,} a question may have: put long material in the context "
            "(a file, an upload or text) and ask about it"
        )
    elif not run.question and "task" not in errors:  # a task that failed has no question
        errors["question"] = "the question is empty: say what you want to know about the context"
    elif program:
        try:
            program_question(program, run.question)  # a known template
            run.program = program
        except ValueError as exc:
            errors["program"] = str(exc)
    if errors:
        raise RunInputError(errors)

    if task is not None:
        path = ctx.context_dir() / f"{run.id}.txt"
        task.write_context(path)
        run.context_source = Run.Source.TASK
        run.task = {"name": task.name, "tokens": context.tokens, "seed": context.seed}
        run.expected_answer = "" if asks_own else task.expected_answer
        run.context_chars = task.context_chars
    elif context.path is not None:
        run.context_source = Run.Source.PATH
    else:
        path = ctx.write_text(run.id, context.text or "")
        run.context_source = Run.Source.TEXT
        run.context_chars = len(context.text or "")
    run.context_path = str(path)
    run.save()
    return run


def _check_sandbox() -> dict[str, str]:
    """A run whose REPL could not be isolated is refused before it exists: the sandbox fails
    closed (FRLM_SANDBOX_ISOLATION=none is the operator's way to opt out, by name)."""
    problem = isolation_problem(settings.FRLM_SANDBOX_ISOLATION, settings.FRLM_SANDBOX_UID)
    return {"sandbox": problem} if problem else {}


def _check_venues(names: list[str]) -> dict[str, str]:
    if not names:
        return {"venues": "name at least one venue, e.g. local"}
    known = set(Venue.objects.values_list("name", flat=True))
    unknown = [n for n in names if n not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none yet"
        return {
            "venues": f"unknown venue {', '.join(unknown)} (known: {listed}); start a worker "
            f"for it with `python manage.py frlm_worker --venue {unknown[0]}`"
        }
    if len(set(names)) != len(names):
        return {"venues": "a venue is named twice"}
    return {}


def run_replay(
    source: Run,
    *,
    from_turn: int | None = None,
    policy_changes: dict[str, Any] | None = None,
    root_model: ModelSpec | None = None,
    worker_model: ModelSpec | None = None,
    owner: Any = None,
) -> Run:
    """A new run that re-executes `source` from its cassette: all of it (no model calls,
    same answer and span structure), or its first `from_turn` root turns and then live,
    with changed policy or models (a what-if). Nothing is saved when anything is wrong."""
    errors: dict[str, str] = _check_sandbox()
    if not source.done:
        errors["run"] = f"run {source.id} is {source.status}; replay it once it has finished"
    elif source.context_source == Run.Source.IMPORTED:
        # Said alone: the checks below would read the imported trace file as the context
        # and advise moving it, which cannot help (a review).
        raise RunInputError(
            {
                "run": f"run {source.id} was imported from a trace: it has no context to "
                "re-execute; replay the original run where it was recorded"
            }
        )
    elif not store.event_count(source.id):
        errors["run"] = f"run {source.id} has no stored trace to replay from"
    if from_turn is None and (policy_changes or root_model or worker_model):
        errors["from_turn"] = (
            "a full replay only plays the recording back; to change the policy or a model, "
            "say from which root turn on to go live"
        )
    elif from_turn is not None and not 0 <= from_turn <= source.turns:
        errors["from_turn"] = f"run {source.id} has root turns 1 to {source.turns}; got {from_turn}"
    try:
        policy = Policy.from_dict({**source.policy, **(policy_changes or {})}).to_dict()
    except PolicyError as exc:
        errors["policy"] = str(exc)
    try:
        written_here = source.context_source != Run.Source.PATH
        ctx.check_path(source.context_path, ctx.context_roots(written_here=written_here))
    except ctx.ContextError as exc:
        errors["context"] = f"the recorded run's context cannot be read again: {exc}"
    errors.update(_check_venues(list(source.venues)))
    if errors:
        raise RunInputError(errors)

    def replayed(recorded: dict[str, Any], override: ModelSpec | None) -> dict[str, Any]:
        base = ModelSpec.from_dict(recorded)
        live = (override or base.live() or base) if from_turn is not None else None
        return cassette_spec(recorded, source.id, live=live).to_dict()

    run = Run(
        question=source.question,
        program=source.program,
        context_source=source.context_source,
        context_path=source.context_path,
        context_chars=source.context_chars,
        task=source.task,
        expected_answer=source.expected_answer,
        policy=policy,
        venues=list(source.venues),
        root_model=replayed(source.root_model, root_model),
        worker_model=replayed(source.worker_model, worker_model),
        replay_of=source,
        replay_turn=from_turn,
        owner=owner,
    )
    run.save()
    return run


def run_launch(run: Run) -> None:
    """Hand the run to a conductor once the row is committed. A broker that does not take
    it (Redis down since the page or command looked) fails the run with the reason and
    raises RunLaunchError, where the commit is: a run left queued would wait for ever."""
    # By name: importing runs.tasks would load the whole conductor engine (half a second of
    # a command's start) only to queue one message.
    from frlm_web.celery import app

    def send() -> None:
        try:
            app.send_task(CONDUCT_TASK, args=[run.id])
        except Exception as exc:  # kombu's OperationalError and what lies under it
            reason = (
                f"could not be handed to a conductor: Redis did not take it ({exc}); "
                "start the stack with `make up` and launch it again"
            )
            Run.objects.filter(id=run.id, status=Run.Status.QUEUED).update(
                status=Run.Status.FAILED, error=reason, finished=timezone.now()
            )
            raise RunLaunchError(f"run {run.id} {reason}") from exc

    transaction.on_commit(send)


def folder_note(run: Run) -> str:
    """For a run over a folder, which files it leaves out and why ("" when none, or not a
    folder), to say as it is launched: the conductor joins the same files."""
    if run.context_source != Run.Source.PATH or not Path(run.context_path).is_dir():
        return ""
    try:
        note = ctx.scan_folder(Path(run.context_path), ctx.context_roots()).note()
    except (ctx.ContextError, OSError):  # a file gone since it was checked, say
        return ""  # the run itself says why, as it starts
    return f"context folder {run.context_path}: {note}" if note else ""


def tier_note(run: Run) -> str:
    """For a run on the redundant tier whose venues have fewer live workers than an answer
    needs to agree, that its untrusted workers' answers will stay unresolved ("" else, and
    when Redis cannot say). A review's run on one worker found out only from its trace."""
    policy = run.policy or {}
    if policy.get("tier") != "redundant":
        return ""
    agree = int(policy.get("agree") or 2)
    venues = [*run.venues, *(v for v in str(policy.get("verify_venues") or "").split(",") if v)]
    try:
        live = {
            w["worker_id"]: w for v in dict.fromkeys(venues) for w in live_workers(get_redis(), v)
        }
    except OUTAGE_ERRORS:
        return ""
    if len(live) >= agree or (live and all(w.get("trusted") for w in live.values())):
        return ""  # enough to agree, or trusted workers, whose answers stand alone
    return (
        f"tier=redundant accepts an answer once {agree} workers give it, and the run's venues "
        f"({', '.join(dict.fromkeys(venues))}) have {len(live)} live worker(s) now: unless more "
        "join, an untrusted worker's answers stay unresolved and the run fails; start more "
        "(manage.py frlm_worker --venue V) or run on tier=best_effort"
    )


def launch_notes(run: Run) -> list[str]:
    """What to say as a run is launched, beside it: a folder's files left out, a tier its
    venues cannot serve now."""
    return [note for note in (folder_note(run), tier_note(run)) if note]


def run_cancel(run: Run) -> None:
    request_cancel(get_redis(), run.id)
    Run.objects.filter(id=run.id, status=Run.Status.QUEUED).update(
        status=Run.Status.CANCELLED, error="cancelled before it started"
    )
