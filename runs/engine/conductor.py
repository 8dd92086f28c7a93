"""The conductor: runs one FRLM run's RLM loop. The root model writes code, the sandboxed
REPL runs it, REPL functions fan sub-queries out to venues; every step is a span.

The loop reads here: prepare the context, root turns, REPL cells, FINAL, finish. What it
stands on sits beside it: rlm_context (the text each RLM reads), turns (the root model's
calls and folding), repl_calls (the REPL functions) and finish (how a run ends)."""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from frlm_web.redis_client import get_redis
from runs.engine import prompts
from runs.engine.context import PreparedContext
from runs.engine.fanout import Fanout, Totals
from runs.engine.fanout.book import load_book
from runs.engine.finish import (
    RunAbort,
    partial_reason,
    run_done,
    run_record,
    run_record_failed,
    storable,
)
from runs.engine.parsing import FinalInText, code_blocks, final_in_text
from runs.engine.policy import Policy
from runs.engine.progress import cancel_requested, write_progress
from runs.engine.repl_calls import ReplCalls, objective_check
from runs.engine.rlm_context import RlmContext, run_context
from runs.engine.turns import RootTurns
from runs.lease import keeper, open_spans_key
from runs.models import Run
from runs.orphans import CONDUCTOR_GROUP
from runs.sandbox import CellResult, CellStopped, Sandbox, SandboxLimits
from traces import caps
from traces.emitter import Emitter, Span
from workers.backends import ModelSpec

__all__ = [
    "Conductor",
    "RlmContext",
    "RunAbort",
    "cell_text",
    "conductor_name",
    "objective_check",
    "prose_of",
]

log = logging.getLogger(__name__)

_BLOCKS = re.compile(r"```.*?```", re.S)


def conductor_name() -> str:
    """This conductor process as "name:pid" (empty outside a conductor): the pid tells a
    restarted conductor of the same name from the one that claimed a run."""
    if os.environ.get("FRLM_PRESENCE_GROUP") != CONDUCTOR_GROUP:
        return ""
    return f"{os.environ.get('FRLM_PRESENCE_NAME', 'conductor')}:{os.getpid()}"


@dataclass
class _Rlm:
    """One RLM as its loop goes: where its spans hang and how many cells it has run."""

    depth: int
    parent: str  # the span its turns and cells hang under
    span: str  # the span its REPL calls hang under: the running cell's, else `parent`
    cells: int = 0
    errors: int = 0


class Conductor:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.policy = Policy.from_dict(run.policy)
        self.client = get_redis()
        # Its open spans are kept in Redis: if this process dies, whoever finds its lease
        # lapsed ends them as abandoned (runs/lease.py).
        self.emitter = Emitter(self.client, run.id, open_spans=open_spans_key(run.id))
        root_model = ModelSpec.from_dict(run.root_model)
        self.totals = Totals()
        self.phase = "starting"
        self.prepared: PreparedContext | None = None
        self.fanout = Fanout(
            run_id=run.id,
            client=self.client,
            emitter=self.emitter,
            policy=self.policy,
            venue_names=list(run.venues),
            worker_model=ModelSpec.from_dict(run.worker_model),
            totals=self.totals,
            cancelled=lambda: cancel_requested(self.client, run.id),
            on_progress=self.report,
        )
        if run.replay_of_id and run.replay_turn is None:
            # A full replay follows the recording's decisions, read once here (fanout.book).
            self.fanout.scope.book = load_book(run.replay_of_id)
        self.calls = ReplCalls(
            fanout=self.fanout,
            emitter=self.emitter,
            policy=self.policy,
            totals=self.totals,
            rlm=self.rlm,
            root_model=lambda: self.root.model.model,
        )
        self.root = RootTurns(
            model=root_model,
            run_id=run.id,
            policy=self.policy,
            emitter=self.emitter,
            fanout=self.fanout,
            totals=self.totals,
            subqueries=self.calls.subqueries,
            stop=self.cell_stop,
        )

    # --- the run -----------------------------------------------------------------------
    def conduct(self) -> None:
        """1. claim the run and take its lease, 2. open its span, 3. answer the question as
        an RLM at depth 0, 4. record the answer, totals and status whatever happened, 5. give
        the lease back."""
        name = conductor_name()
        claimed = Run.objects.filter(id=self.run.id, status=Run.Status.QUEUED).update(
            status=Run.Status.RUNNING, started=timezone.now(), conductor=name
        )
        if not claimed:
            log.warning("run %s is not queued any more; another conductor has it", self.run.id)
            return
        keeper().hold(self.run.id, name or f"pid {os.getpid()}")
        try:
            self._conduct()
        finally:
            keeper().release(self.run.id)

    def _conduct(self) -> None:
        started = time.perf_counter()
        named = self.run.context_path if self.run.context_source == Run.Source.PATH else None
        run_span = self.emitter.start(
            "Run.Init",
            question=self.run.question,
            program=self.run.program or None,
            policy=self.policy.to_dict(),
            root_model=self.root.model.label,
            worker_model=ModelSpec.from_dict(self.run.worker_model).label,
            venues=sorted(self.run.venues),
            # What the context was, so a diff can say the runs read different ones: the
            # task that made it, the path a user named, its size (a copy's own path, of a
            # task or an upload, differs from run to run and says nothing).
            context_source=self.run.context_source,
            task=self.run.task or None,
            context_path=named,
            context_bytes=_file_bytes(self.run.context_path),
            replay_of=self.run.replay_of_id,
            replay_turn=self.run.replay_turn,
        )
        status, answer, error = Run.Status.SUCCEEDED, "", ""
        try:
            context = self.prepare_context()
            answer = self.rlm(self.run.root_question, context, depth=0, parent=run_span.span_id)
            if self.fanout.accounts.exhausted:
                status = Run.Status.PARTIAL
                error = partial_reason(self.totals, self.fanout.accounts, answered=True)
        except RunAbort as exc:
            status, error = exc.status, str(exc)
        except Exception as exc:  # the run must end with a reason, whatever broke
            log.exception("run %s failed", self.run.id)
            status, error = Run.Status.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        wall_ms = (time.perf_counter() - started) * 1000
        self.finish(status, answer, error, wall_ms, run_span)

    def prepare_context(self) -> RlmContext:
        """The run's context, prepared once (runs.engine.rlm_context)."""
        self.prepared, context = run_context(self.run)
        return context

    def check_budget(self) -> None:
        """At the run's budget cap no further root turn is taken."""
        if self.fanout.accounts.exhausted:
            reason = partial_reason(self.totals, self.fanout.accounts, answered=False)
            raise RunAbort(reason, status=Run.Status.PARTIAL)

    def cancel_pending(self) -> bool:
        return cancel_requested(self.client, self.run.id)

    def cell_stop(self) -> bool:
        """A running cell's question (`Sandbox.execute`'s `stop`): a Redis that stays away
        past the client's ride through the outage does not end the cell; the next turn's
        check says what it must."""
        try:
            return self.cancel_pending()
        except redis.RedisError:
            return False

    def check_cancelled(self) -> None:
        if self.cancel_pending():
            raise RunAbort("the run was cancelled", status=Run.Status.CANCELLED)

    def finish(self, status: str, answer: str, error: str, wall_ms: float, run_span: Span) -> None:
        # A FINAL the REPL built far past any real answer is kept cut, and says so.
        answer, _whole = caps.cut(answer)
        if keeper().lost(self.run.id):
            # A watcher judged this conductor dead (starved past its lease) and failed the
            # run, ending its spans: nothing is recorded over that.
            self.fanout.close()
            log.error("run %s was failed as abandoned while it ran; its outcome is dropped",
                      self.run.id)  # fmt: skip
            return
        answer, error = storable(answer), storable(error)
        try:
            correct, figures = run_record(
                self.run,
                status=status,
                answer=answer,
                error=error,
                wall_ms=wall_ms,
                fanout=self.fanout,
                totals=self.totals,
            )
        except Exception as exc:  # a run whose row cannot be written must still end
            log.exception("run %s: its outcome could not be stored", self.run.id)
            status = Run.Status.FAILED
            error = f"internal error: the run's outcome could not be stored: {exc}"[:2000]
            correct, figures = None, run_record_failed(self.run, error, wall_ms, self.fanout)
        self.phase = status
        self.report()
        run_done(
            self.emitter,
            run_span,
            status=status,
            answer=answer,
            error=error,
            correct=correct,
            wall_ms=wall_ms,
            totals=self.totals,
            figures=figures,
        )

    def report(self) -> None:
        write_progress(self.client, self.run.id, phase=self.phase, totals=self.totals)

    # --- one RLM (the root, or a child from rlm_query) ----------------------------------
    def rlm(self, question: str, context: RlmContext, *, depth: int, parent: str) -> str:
        """Answer ``question`` as an RLM: a REPL of its own over ``context``, root turns until
        an answer."""
        limits = SandboxLimits(
            cell_wall_s=self.policy.cell_timeout_s,
            cpu_s=self.policy.repl_cpu_s,
            memory_mb=self.policy.cell_memory_mb,
            output_chars=self.policy.output_chars,
            scratch_mb=self.policy.scratch_mb,
        )
        sandbox_root = Path(settings.FRLM_SANDBOX_DIR)
        sandbox_root.mkdir(parents=True, exist_ok=True)
        rlm = _Rlm(depth=depth, parent=parent, span=parent)
        self.calls.fragment_paths.add(str(context.path.resolve()))

        def handler(name: str, kwargs: dict[str, Any]) -> Any:
            return self.calls.serve(name, kwargs, depth=depth, parent=rlm.span, context=context)

        with Sandbox(
            context.path,
            handler=handler,
            limits=limits,
            workdir_root=sandbox_root,
            isolation=settings.FRLM_SANDBOX_ISOLATION,
            context_index=context.index_path,
            uid=settings.FRLM_SANDBOX_UID,
        ) as sandbox:
            if depth == 0:
                self.loaded(sandbox, context, parent)
            messages = [
                {
                    "role": "system",
                    "content": prompts.system_prompt(
                        chars=context.chars, policy=self.policy, depth=depth
                    ),
                },
                {"role": "user", "content": prompts.question_message(question)},
            ]
            return self.turns(messages, sandbox, rlm)

    def loaded(self, sandbox: Sandbox, context: RlmContext, parent: str) -> None:
        """The root RLM's REPL holds the run's context: the run records the isolation it got,
        the trace what was loaded."""
        Run.objects.filter(id=self.run.id).update(isolation=sandbox.isolation)
        encoding = self.prepared.encoding if self.prepared else None
        self.emitter.instant(
            "Env.LoadFragment",
            parent=parent,
            chars=context.chars,
            bytes=self.prepared.index.bytes if self.prepared else None,
            sha256=context.sha256 or None,
            lazy=True,
            not_utf8=encoding,
            isolation=sandbox.isolation,
            isolation_kind=sandbox.isolation_kind,
            **self._folder_attrs(),
        )

    def _folder_attrs(self) -> dict[str, Any]:
        """A folder context's files joined and left out, for the trace (the first 50)."""
        folder = self.prepared.folder if self.prepared else None
        if folder is None:
            return {}
        return {
            "files": len(folder.files),
            "left_out": [f"{path}: {why}" for path, why in folder.left_out[:50]],
            "left_out_count": folder.left_out_count,
            "hidden": folder.hidden,
        }

    def turns(self, messages: list[dict[str, str]], sandbox: Sandbox, rlm: _Rlm) -> str:
        """Root turns until an answer: a reply's code blocks run as cells; a cell's FINAL or
        one in the reply's prose ends the RLM, else the cells' outputs are the next message."""
        for turn in range(1, self.policy.max_turns + 1):
            self.check_cancelled()
            self.root.fold(messages, sandbox, depth=rlm.depth, parent=rlm.parent)
            reply = self.decode(messages, depth=rlm.depth, parent=rlm.parent, turn=turn)
            answer, outputs = self.cells(reply, sandbox, rlm, turn=turn)
            if answer is not None:
                return answer
            final = final_in_text(reply)
            if final is not None:
                return self.resolve_final(final, sandbox, rlm)
            messages.append(
                {"role": "user", "content": "\n\n".join(outputs) or prompts.NO_CODE_NUDGE}
            )
        return self.last_turn(messages, sandbox, rlm)

    def last_turn(self, messages: list[dict[str, str]], sandbox: Sandbox, rlm: _Rlm) -> str:
        """Past policy.max_turns, one more turn is asked for FINAL; a reply without one
        answers with its prose."""
        messages.append({"role": "user", "content": prompts.FINAL_NUDGE})
        self.root.fold(messages, sandbox, depth=rlm.depth, parent=rlm.parent)
        turn = self.policy.max_turns + 1
        reply = self.decode(messages, depth=rlm.depth, parent=rlm.parent, turn=turn)
        for code in code_blocks(reply):
            rlm.cells += 1
            result = self.execute(sandbox, code, rlm, turn=turn, cell=rlm.cells)
            if result.final is not None:
                return result.final
        final = final_in_text(reply)
        if final is not None:
            return self.resolve_final(final, sandbox, rlm)
        return prose_of(reply)

    def decode(self, messages: list[dict[str, str]], *, depth: int, parent: str, turn: int) -> str:
        """One root-model turn; its reply joins the conversation."""
        self.phase = f"turn {turn}" if depth == 0 else self.phase
        self.totals.turns += 1 if depth == 0 else 0
        if depth == 0 and self.run.replay_turn is not None and turn == self.run.replay_turn + 1:
            self.go_live(turn)
        self.report()
        return self.root.decode(messages, depth=depth, parent=parent, turn=turn)

    def go_live(self, turn: int) -> None:
        """A what-if replay leaves its cassette here: from this root turn on, the root model
        and every sub-query are live (with the run's possibly changed policy and models)."""
        root, worker = self.root.model.live(), self.fanout.worker_model.live()
        if root is None or worker is None:
            raise RunAbort("this replay has no live model to go on with after its cassette")
        self.root.model, self.fanout.worker_model = root, worker
        log.info("run %s: live from root turn %d", self.run.id, turn)

    # --- REPL cells and FINAL ----------------------------------------------------------
    def cells(
        self, reply: str, sandbox: Sandbox, rlm: _Rlm, *, turn: int
    ) -> tuple[str | None, list[str]]:
        """The reply's code blocks run in order: (the answer a cell's FINAL gave or None,
        the cells' outputs for the next message)."""
        outputs: list[str] = []
        for code in code_blocks(reply):
            rlm.cells += 1
            result = self.execute(sandbox, code, rlm, turn=turn, cell=rlm.cells)
            outputs.append(prompts.output_message(rlm.cells, cell_text(result)))
            if result.final is not None:
                return result.final, outputs
            self.check_budget()
            if result.error:
                rlm.errors += 1
                if rlm.errors > self.policy.max_errors:
                    raise RunAbort(
                        f"the REPL failed {rlm.errors} time{'s' * (rlm.errors != 1)} "
                        f"(policy.max_errors={self.policy.max_errors}); last: "
                        + (result.error_message or result.error)
                    )
        return None, outputs

    def execute(
        self, sandbox: Sandbox, code: str, rlm: _Rlm, *, turn: int, cell: int
    ) -> CellResult:
        span = self.emitter.start(
            "Repl.Exec", parent=rlm.parent, depth=rlm.depth, payload=code, turn=turn, cell=cell
        )
        rlm.span = span.span_id
        try:
            # A cancel ends the cell within a quarter of a second, whatever its code does
            # (a long loop or sleep used to hold the run, its conductor slot and its
            # spending until the cell's wall clock).
            result = sandbox.execute(code, stop=self.cell_stop)
        except CellStopped as exc:
            span.end("error", error=f"cancelled: the cell was {exc}")
            raise RunAbort("the run was cancelled", status=Run.Status.CANCELLED) from None
        except BaseException as exc:
            # Whatever stops the run here (a cancel, an error of the host's) ends the cell's
            # span with it: one was left open for good (a review).
            span.end("error", error=f"{type(exc).__name__}: {exc}"[:300])
            raise
        finally:
            rlm.span = rlm.parent
        if self.calls.abort is not None:
            span.end("error", error=str(self.calls.abort))
            raise self.calls.abort
        span.end(
            "error" if result.error else "ok",
            payload=cell_text(result),
            error=result.error,
            error_message=result.error_message,
            restarted=result.restarted or None,
            cpu_ms=result.cpu_ms,
            final=result.final is not None or None,
        )
        return result

    def resolve_final(self, final: FinalInText, sandbox: Sandbox, rlm: _Rlm) -> str:
        if final.variable is None:
            return final.answer or ""
        result = self.execute(sandbox, f"FINAL_VAR({final.variable!r})", rlm, turn=0, cell=0)
        if result.final is None:
            raise RunAbort(f"FINAL_VAR({final.variable}) named no variable of the REPL")
        return result.final


def prose_of(reply: str) -> str:
    """A reply without its code blocks: the answer of a model that gave no FINAL."""
    return _BLOCKS.sub("", reply).strip() or reply.strip()


def cell_text(result: CellResult) -> str:
    parts = [result.stdout.rstrip("\n")]
    if result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    if result.error_message:
        parts.append(f"[{result.error_message}]")
    return "\n".join(p for p in parts if p) or "(no output)"


def _file_bytes(path: str) -> int | None:
    """The size of a context file; None for a folder or a file that is not there."""
    try:
        return os.stat(path).st_size if os.path.isfile(path) else None
    except (OSError, ValueError):
        return None
