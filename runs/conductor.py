"""The conductor: runs one FRLM run's RLM loop. The root model writes code, the sandboxed
REPL runs it, REPL functions fan sub-queries out to venues; every step is a span."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from frlm_web.redis_client import get_redis
from runs import prompts
from runs.context import ContextError, check_path, materialise
from runs.fanout import Fanout, FanoutAbort, LimitExceeded, Totals
from runs.models import Run
from runs.orphans import CONDUCTOR_GROUP
from runs.parsing import code_blocks, final_in_text
from runs.policy import Policy
from runs.progress import cancel_requested, write_progress
from runs.sandbox import CellResult, Sandbox, SandboxCallError, SandboxLimits
from runs.taskgen import answer_matches
from traces.emitter import Emitter
from workers.backends import ModelError, ModelSpec, chat

log = logging.getLogger(__name__)

_BLOCKS = re.compile(r"```.*?```", re.S)


def conductor_name() -> str:
    """This conductor process as "name:pid" (empty outside a conductor): the pid tells a
    restarted conductor of the same name from the one that claimed a run."""
    if os.environ.get("FRLM_PRESENCE_GROUP") != CONDUCTOR_GROUP:
        return ""
    return f"{os.environ.get('FRLM_PRESENCE_NAME', 'conductor')}:{os.getpid()}"


class RunAbort(Exception):
    def __init__(self, message: str, status: str = Run.Status.FAILED) -> None:
        super().__init__(message)
        self.status = status


class Conductor:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.policy = Policy.from_dict(run.policy)
        self.client = get_redis()
        self.emitter = Emitter(self.client, run.id)
        self.root_model = ModelSpec.from_dict(run.root_model)
        self.totals = Totals()
        self.phase = "starting"
        self.abort: RunAbort | None = None
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

    # --- the run -----------------------------------------------------------------------
    def conduct(self) -> None:
        """1. claim the run, 2. open its span, 3. answer the question as an RLM at depth 0,
        4. record the answer, totals and status whatever happened."""
        claimed = Run.objects.filter(id=self.run.id, status=Run.Status.QUEUED).update(
            status=Run.Status.RUNNING, started=timezone.now(), conductor=conductor_name()
        )
        if not claimed:
            log.warning("run %s is not queued any more; another conductor has it", self.run.id)
            return
        started = time.perf_counter()
        run_span = self.emitter.start(
            "Run.Init",
            question=self.run.question,
            policy=self.policy.to_dict(),
            root_model=self.root_model.label,
            worker_model=ModelSpec.from_dict(self.run.worker_model).label,
            venues=list(self.run.venues),
            context_source=self.run.context_source,
            replay_of=self.run.replay_of_id,
            replay_turn=self.run.replay_turn,
        )
        status, answer, error = Run.Status.SUCCEEDED, "", ""
        try:
            path, chars = self.prepare_context()
            answer = self.rlm(self.run.question, path, chars, depth=0, parent=run_span.span_id)
        except RunAbort as exc:
            status, error = exc.status, str(exc)
        except Exception as exc:  # the run must end with a reason, whatever broke
            log.exception("run %s failed", self.run.id)
            status, error = Run.Status.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        wall_ms = (time.perf_counter() - started) * 1000
        self.finish(status, answer, error, wall_ms, run_span)

    def prepare_context(self) -> tuple[Path, int]:
        try:
            path, chars = materialise(self.run.id, check_path(self.run.context_path))
        except ContextError as exc:
            raise RunAbort(f"context: {exc}") from exc
        if chars == 0:
            raise RunAbort("context: it holds no text")
        Run.objects.filter(id=self.run.id).update(context_chars=chars)
        return path, chars

    def finish(self, status: str, answer: str, error: str, wall_ms: float, run_span: Any) -> None:
        correct = None
        if status == Run.Status.SUCCEEDED and self.run.expected_answer:
            correct = answer_matches(self.run.expected_answer, answer)
        t = self.totals
        Run.objects.filter(id=self.run.id).update(
            status=status,
            answer=answer,
            error=error,
            correct=correct,
            finished=timezone.now(),
            wall_ms=wall_ms,
            turns=t.turns,
            subqueries=t.subqueries,
            subqueries_failed=t.subqueries_failed,
            tokens_in=t.tokens_in,
            tokens_out=t.tokens_out,
            cost=t.cost,
        )
        self.phase = status
        self.report()
        span_status = {"succeeded": "ok", "cancelled": "cancelled"}.get(status, "error")
        self.emitter.instant(
            "Run.Done",
            parent=run_span.span_id,
            status=span_status,
            payload=answer or error,
            answer=answer[:500],
            error=error or None,
            correct=correct,
            wall_ms=wall_ms,
            subqueries=t.subqueries,
            tokens_in=t.tokens_in,
            tokens_out=t.tokens_out,
            cost=t.cost,
        )
        run_span.end(
            span_status,
            ms=wall_ms,
            tokens_in=t.tokens_in,
            tokens_out=t.tokens_out,
            cost=t.cost,
            error=error or None,
        )

    def report(self) -> None:
        write_progress(self.client, self.run.id, phase=self.phase, totals=self.totals)

    # --- one RLM (the root, or a child from rlm_query) ----------------------------------
    def rlm(self, question: str, context_path: Path, chars: int, *, depth: int, parent: str) -> str:
        limits = SandboxLimits(
            cell_wall_s=self.policy.cell_timeout_s,
            cpu_s=self.policy.repl_cpu_s,
            memory_mb=self.policy.cell_memory_mb,
            output_chars=self.policy.output_chars,
        )
        sandbox_root = Path(settings.FRLM_SANDBOX_DIR)
        sandbox_root.mkdir(parents=True, exist_ok=True)
        state = {"span": parent}

        def handler(name: str, kwargs: dict[str, Any]) -> Any:
            return self.repl_call(
                name, kwargs, depth=depth, parent=state["span"], context=context_path
            )

        with Sandbox(
            context_path,
            handler=handler,
            limits=limits,
            workdir_root=sandbox_root,
            isolation=settings.FRLM_SANDBOX_ISOLATION,
        ) as sandbox:
            if depth == 0:
                Run.objects.filter(id=self.run.id).update(isolation=sandbox.isolation)
                self.emitter.instant(
                    "Env.LoadFragment",
                    parent=parent,
                    chars=chars,
                    isolation=sandbox.isolation,
                    isolation_kind=sandbox.isolation_kind,
                )
            messages = [
                {
                    "role": "system",
                    "content": prompts.system_prompt(chars=chars, policy=self.policy, depth=depth),
                },
                {"role": "user", "content": prompts.question_message(question)},
            ]
            cells = 0
            errors = 0
            for turn in range(1, self.policy.max_turns + 1):
                self.check_cancelled()
                reply = self.decode(messages, depth=depth, parent=parent, turn=turn)
                blocks = code_blocks(reply)
                outputs: list[str] = []
                for code in blocks:
                    cells += 1
                    result = self.execute(
                        sandbox,
                        code,
                        depth=depth,
                        parent=parent,
                        turn=turn,
                        cell=cells,
                        state=state,
                    )
                    outputs.append(prompts.output_message(cells, cell_text(result)))
                    if result.final is not None:
                        return result.final
                    if result.error:
                        errors += 1
                        if errors > self.policy.max_errors:
                            raise RunAbort(
                                f"the REPL failed {errors} times (policy.max_errors="
                                f"{self.policy.max_errors}); last: "
                                + (result.error_message or result.error)
                            )
                final = final_in_text(reply)
                if final is not None:
                    return self.resolve_final(
                        final, sandbox, depth=depth, parent=parent, state=state
                    )
                messages.append(
                    {"role": "user", "content": "\n\n".join(outputs) or prompts.NO_CODE_NUDGE}
                )
            messages.append({"role": "user", "content": prompts.FINAL_NUDGE})
            turn = self.policy.max_turns + 1
            reply = self.decode(messages, depth=depth, parent=parent, turn=turn)
            for code in code_blocks(reply):
                cells += 1
                result = self.execute(
                    sandbox, code, depth=depth, parent=parent, turn=turn, cell=cells, state=state
                )
                if result.final is not None:
                    return result.final
            final = final_in_text(reply)
            if final is not None:
                return self.resolve_final(final, sandbox, depth=depth, parent=parent, state=state)
            return prose_of(reply)

    def decode(self, messages: list[dict[str, str]], *, depth: int, parent: str, turn: int) -> str:
        """One root-model turn; its reply joins the conversation."""
        self.phase = f"turn {turn}" if depth == 0 else self.phase
        self.totals.turns += 1 if depth == 0 else 0
        if depth == 0 and self.run.replay_turn is not None and turn == self.run.replay_turn + 1:
            self.go_live(turn)
        self.report()
        span = self.emitter.start(
            "Run.Decode", parent=parent, depth=depth, turn=turn, model=self.root_model.label
        )
        try:
            reply = chat(self.root_model, messages)
        except ModelError as exc:
            span.end("error", error=str(exc))
            raise RunAbort(f"the root model failed: {exc}") from exc
        self.totals.add_tokens(reply.tokens_in, reply.tokens_out, reply.cost)
        span.end(
            "ok",
            payload=reply.text,
            tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out,
            cost=reply.cost,
            request_hash=reply.request_hash,
            replayed=reply.replayed or None,
        )
        messages.append({"role": "assistant", "content": reply.text})
        return reply.text

    def go_live(self, turn: int) -> None:
        """A what-if replay leaves its cassette here: from this root turn on, the root model
        and every sub-query are live (with the run's possibly changed policy and models)."""
        root, worker = self.root_model.live(), self.fanout.worker_model.live()
        if root is None or worker is None:
            raise RunAbort("this replay has no live model to go on with after its cassette")
        self.root_model, self.fanout.worker_model = root, worker
        log.info("run %s: live from root turn %d", self.run.id, turn)

    def execute(
        self,
        sandbox: Sandbox,
        code: str,
        *,
        depth: int,
        parent: str,
        turn: int,
        cell: int,
        state: dict[str, str],
    ) -> CellResult:
        span = self.emitter.start(
            "Repl.Exec", parent=parent, depth=depth, payload=code, turn=turn, cell=cell
        )
        state["span"] = span.span_id
        try:
            result = sandbox.execute(code)
        finally:
            state["span"] = parent
        if self.abort is not None:
            span.end("error", error=str(self.abort))
            raise self.abort
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

    def resolve_final(
        self, final: Any, sandbox: Sandbox, *, depth: int, parent: str, state: dict[str, str]
    ) -> str:
        if final.variable is None:
            return final.answer or ""
        result = self.execute(
            sandbox,
            f"FINAL_VAR({final.variable!r})",
            depth=depth,
            parent=parent,
            turn=0,
            cell=0,
            state=state,
        )
        if result.final is None:
            raise RunAbort(f"FINAL_VAR({final.variable}) named no variable of the REPL")
        return result.final

    def check_cancelled(self) -> None:
        if cancel_requested(self.client, self.run.id):
            raise RunAbort("the run was cancelled", status=Run.Status.CANCELLED)

    # --- REPL functions ----------------------------------------------------------------
    def repl_call(
        self, name: str, kwargs: dict[str, Any], *, depth: int, parent: str, context: Path
    ) -> Any:
        """Serve a REPL function. Limit breaches become errors in the REPL code; a run that
        cannot go on (no workers, cancelled) is aborted after the cell returns."""
        try:
            if name == "llm_query":
                return self.subqueries([_prompt(kwargs.get("prompt"))], depth, parent)[0]
            if name == "llm_query_batched":
                prompts_ = kwargs.get("prompts")
                if not isinstance(prompts_, list):
                    raise SandboxCallError("llm_query_batched takes a list of prompt strings")
                return self.subqueries([_prompt(p) for p in prompts_], depth, parent)
            if name == "rlm_query":
                return self.child_rlm(
                    _prompt(kwargs.get("prompt")),
                    kwargs.get("context"),
                    depth=depth,
                    parent=parent,
                    context=context,
                )
        except LimitExceeded as exc:
            raise SandboxCallError(str(exc)) from exc
        except FanoutAbort as exc:
            self.abort = RunAbort(str(exc), status=exc.status)
            raise SandboxCallError(str(exc)) from exc
        except RunAbort as exc:
            self.abort = exc
            raise SandboxCallError(str(exc)) from exc
        raise SandboxCallError(f"{name} is not a REPL function")

    def subqueries(self, prompts_: list[str], depth: int, parent: str) -> list[str]:
        if not prompts_:
            return []
        outcomes = self.fanout.run_batch(prompts_, depth=depth, parent=parent)
        failed = [o for o in outcomes if o.status == "error"]
        if failed and len(failed) == len(outcomes):
            raise FanoutAbort(
                f"every sub-query of a batch of {len(outcomes)} failed; first: {failed[0].error}"
            )
        return [o.reply() for o in outcomes]

    def child_rlm(
        self, prompt: str, child_context: Any, *, depth: int, parent: str, context: Path
    ) -> str:
        """A child RLM one level deeper; at the depth limit it is a plain sub-query."""
        if depth + 1 > self.policy.max_depth:
            self.emitter.instant(
                "SubQuery.Retry",
                parent=parent,
                depth=depth,
                status="rejected",
                reason=f"rlm_query at depth {depth + 1} exceeds policy.max_depth="
                f"{self.policy.max_depth}; answered as llm_query",
            )
            full = prompt if child_context is None else f"{prompt}\n\n{child_context}"
            return self.subqueries([full], depth, parent)[0]
        self.fanout.check_limits(1, what="rlm_query")
        self.totals.calls += 1
        span = self.emitter.start(
            "SubQuery.Submit",
            parent=parent,
            depth=depth + 1,
            payload=prompt,
            kind="rlm",
            venue="conductor",
        )
        with tempfile.TemporaryDirectory(dir=settings.FRLM_SANDBOX_DIR) as tmp:
            path = context
            if child_context is not None:
                path = Path(tmp) / "context.txt"
                path.write_text(str(child_context), encoding="utf-8")
            chars = (
                len(str(child_context))
                if child_context is not None
                else self.run.context_chars or _chars(path)
            )
            try:
                answer = self.rlm(prompt, path, chars, depth=depth + 1, parent=span.span_id)
            except RunAbort as exc:
                span.end("error", error=str(exc))
                raise
        span.end("ok", payload=answer)
        return answer


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


def _prompt(value: Any) -> str:
    if not isinstance(value, str):
        raise SandboxCallError(f"a prompt must be a string, got {type(value).__name__}")
    return value


def _chars(path: Path) -> int:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), ""))
