"""The conductor: runs one FRLM run's RLM loop. The root model writes code, the sandboxed
REPL runs it, REPL functions fan sub-queries out to venues; every step is a span."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from frlm_web.redis_client import get_redis
from runs.engine import folding, fragindex, prompts
from runs.engine.context import ContextError, PreparedContext, check_path, context_prepare
from runs.engine.fanout import Fanout, FanoutAbort, LimitExceeded, Totals
from runs.engine.parsing import code_blocks, final_in_text
from runs.engine.policy import Policy
from runs.engine.progress import cancel_requested, write_progress
from runs.models import Run
from runs.orphans import CONDUCTOR_GROUP
from runs.sandbox import CellResult, Sandbox, SandboxCallError, SandboxLimits
from runs.taskgen import answer_correct
from runs.trust import verify
from runs.trust.accounts import price_of
from runs.trust.budget import BudgetRefused
from traces.emitter import Emitter
from workers import fragments
from workers.backends import ModelError, ModelSpec, chat

log = logging.getLogger(__name__)

_BLOCKS = re.compile(r"```.*?```", re.S)


def conductor_name() -> str:
    """This conductor process as "name:pid" (empty outside a conductor): the pid tells a
    restarted conductor of the same name from the one that claimed a run."""
    if os.environ.get("FRLM_PRESENCE_GROUP") != CONDUCTOR_GROUP:
        return ""
    return f"{os.environ.get('FRLM_PRESENCE_NAME', 'conductor')}:{os.getpid()}"


@dataclass(frozen=True)
class RlmContext:
    """What one RLM's REPL reads: a UTF-8 file, its length, its offset index if known."""

    path: Path
    chars: int
    index_path: Path | None = None
    sha256: str = ""


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
        self.prepared: PreparedContext | None = None
        # Files a fragment marker may name: the run's context and its children's.
        self.fragment_paths: set[str] = set()
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
            context = self.prepare_context()
            answer = self.rlm(self.run.question, context, depth=0, parent=run_span.span_id)
            if self.fanout.accounts.exhausted:
                status, error = Run.Status.PARTIAL, self.partial_reason(answered=True)
        except RunAbort as exc:
            status, error = exc.status, str(exc)
        except Exception as exc:  # the run must end with a reason, whatever broke
            log.exception("run %s failed", self.run.id)
            status, error = Run.Status.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        wall_ms = (time.perf_counter() - started) * 1000
        self.finish(status, answer, error, wall_ms, run_span)

    def prepare_context(self) -> RlmContext:
        """The context as one UTF-8 file with its offset index (runs.engine.context), read in one
        streaming pass at most: the conductor never holds the text."""
        try:
            prepared = context_prepare(self.run.id, check_path(self.run.context_path))
        except ContextError as exc:
            raise RunAbort(f"context: {exc}") from exc
        except OSError as exc:
            raise RunAbort(f"context: {self.run.context_path} cannot be read: {exc}") from exc
        if prepared.chars == 0:
            raise RunAbort("context: it holds no text")
        self.prepared = prepared
        Run.objects.filter(id=self.run.id).update(context_chars=prepared.chars)
        return RlmContext(prepared.path, prepared.chars, prepared.index_path, prepared.sha256)

    def partial_reason(self, *, answered: bool) -> str:
        """Why the run ended at its budget, and what its answer rests on."""
        t = self.totals
        refused = self.fanout.accounts.budget.fill(top=0)["refused"]
        rests = (
            f"the answer rests on the {t.subqueries - t.subqueries_failed} sub-queries that "
            "returned"
            if answered
            else "the program gave no answer before it"
        )
        return (
            f"budget cap reached: {self.fanout.accounts.exhausted} ({refused} dispatches "
            f"refused); {rests}. Raise policy.budget_usd to go further"
        )

    def check_budget(self) -> None:
        """At the run's budget cap no further root turn is taken."""
        if self.fanout.accounts.exhausted:
            raise RunAbort(self.partial_reason(answered=False), status=Run.Status.PARTIAL)

    def finish(self, status: str, answer: str, error: str, wall_ms: float, run_span: Any) -> None:
        correct = None
        if status in (Run.Status.SUCCEEDED, Run.Status.PARTIAL) and self.run.expected_answer:
            correct = answer_correct(self.run.task, self.run.expected_answer, answer)
        self.fanout.close()
        figures = self.fanout.accounts.figures(
            dict(self.fanout.tally.figures()), self.fanout.hedged
        )
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
            accounts=figures,
        )
        self.phase = status
        self.report()
        # A run stopped at its budget did what its policy said: cancelled, not an error.
        span_status = {"succeeded": "ok", "cancelled": "cancelled", "partial": "cancelled"}.get(
            status, "error"
        )
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
            run_status=status,
            accounts=figures,
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
    def rlm(self, question: str, context: RlmContext, *, depth: int, parent: str) -> str:
        limits = SandboxLimits(
            cell_wall_s=self.policy.cell_timeout_s,
            cpu_s=self.policy.repl_cpu_s,
            memory_mb=self.policy.cell_memory_mb,
            output_chars=self.policy.output_chars,
        )
        sandbox_root = Path(settings.FRLM_SANDBOX_DIR)
        sandbox_root.mkdir(parents=True, exist_ok=True)
        state = {"span": parent}

        chars = context.chars
        self.fragment_paths.add(str(context.path.resolve()))

        def handler(name: str, kwargs: dict[str, Any]) -> Any:
            return self.repl_call(name, kwargs, depth=depth, parent=state["span"], context=context)

        with Sandbox(
            context.path,
            handler=handler,
            limits=limits,
            workdir_root=sandbox_root,
            isolation=settings.FRLM_SANDBOX_ISOLATION,
            context_index=context.index_path,
        ) as sandbox:
            if depth == 0:
                Run.objects.filter(id=self.run.id).update(isolation=sandbox.isolation)
                encoding = self.prepared.encoding if self.prepared else None
                self.emitter.instant(
                    "Env.LoadFragment",
                    parent=parent,
                    chars=chars,
                    bytes=self.prepared.index.bytes if self.prepared else None,
                    sha256=context.sha256 or None,
                    lazy=True,
                    not_utf8=encoding,
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
                self.fold(messages, sandbox, depth=depth, parent=parent)
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
                    self.check_budget()
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
            self.fold(messages, sandbox, depth=depth, parent=parent)
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

    def fold(self, messages: list[Any], sandbox: Sandbox, *, depth: int, parent: str) -> None:
        """Past policy.fold_tokens, the older turns become one message of summaries made by
        sub-queries; their full text goes into the REPL's `folded` list (runs.engine.folding)."""
        before = folding.tokens_of(messages)
        if before <= self.policy.fold_tokens:
            return
        bounds = folding.foldable(messages)
        if bounds is None:
            return
        start, end = bounds
        old = messages[start:end]
        text = folding.render(old)
        span = self.emitter.start(
            "Context.Fold",
            parent=parent,
            depth=depth,
            tokens_before=before,
            limit=self.policy.fold_tokens,
            messages=len(old),
        )
        pieces = folding.parts(text)
        try:
            replies = self.subqueries(
                [folding.FOLD_HEADER + piece for piece in pieces], depth, span.span_id
            )
        except (LimitExceeded, FanoutAbort) as exc:
            log.warning("run %s: folding by sub-queries failed (%s); cut instead", self.run.id, exc)
            replies = []
        summaries = [r for r in replies if r.strip() and not r.startswith("[frlm:")]
        how = "sub-queries" if summaries else "cut"
        if not summaries:
            summaries = [folding.fallback_summary(text)]
        slot = sandbox.fold(text) - 1
        message = folding.folded_message(summaries, folding.turns_in(old), slot)
        messages[start:end] = [message]
        after = folding.tokens_of(messages)
        span.end(
            "ok",
            payload=message["content"],
            tokens_after=after,
            tokens_before=before,
            folded_chars=len(text),
            summary_chars=len(message["content"]),
            ratio=round(len(text) / max(1, len(message["content"])), 2),
            how=how,
            slot=slot,
        )

    def decode(self, messages: list[dict[str, str]], *, depth: int, parent: str, turn: int) -> str:
        """One root-model turn; its reply joins the conversation."""
        self.phase = f"turn {turn}" if depth == 0 else self.phase
        self.totals.turns += 1 if depth == 0 else 0
        if depth == 0 and self.run.replay_turn is not None and turn == self.run.replay_turn + 1:
            self.go_live(turn)
        self.report()
        accounts_ = self.fanout.accounts
        model = self.root_model.model or self.root_model.kind
        try:
            reservation = accounts_.reserve(
                subquery="",
                provider=model,
                worker_id="conductor",
                tokens_in=folding.tokens_of(messages),
                price=price_of({}, model),
                parent=parent,
                depth=depth,
            )
        except BudgetRefused:
            raise RunAbort(self.partial_reason(answered=False), status=Run.Status.PARTIAL) from None
        span = self.emitter.start(
            "Run.Decode", parent=parent, depth=depth, turn=turn, model=self.root_model.label
        )
        accounts_.reserved(reservation, parent=span.span_id, depth=depth)
        try:
            reply = chat(self.root_model, messages)
        except ModelError as exc:
            accounts_.release(reservation, parent=span.span_id, depth=depth)
            span.end("error", error=str(exc))
            raise RunAbort(f"the root model failed: {exc}") from exc
        accounts_.settle(
            reservation,
            tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out,
            cost=reply.cost,
            parent=span.span_id,
            depth=depth,
        )
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
        self, name: str, kwargs: dict[str, Any], *, depth: int, parent: str, context: RlmContext
    ) -> Any:
        """Serve a REPL function. Limit breaches become errors in the REPL code; a run that
        cannot go on (no workers, cancelled) is aborted after the cell returns."""
        try:
            tier = kwargs.get("tier")
            check = objective_check(kwargs.get("validate"))
            if name == "llm_query":
                prompt = self.checked_prompt(kwargs.get("prompt"))
                return self.subqueries([prompt], depth, parent, tier, check)[0]
            if name == "llm_query_batched":
                prompts_ = kwargs.get("prompts")
                if not isinstance(prompts_, list):
                    raise SandboxCallError("llm_query_batched takes a list of prompt strings")
                prompts_ = [self.checked_prompt(p) for p in prompts_]
                if kwargs.get("check") == "function":
                    return self.checked_by_repl(prompts_, depth, parent, tier)
                return self.subqueries(prompts_, depth, parent, tier, check)
            if name == "objective_verdicts":
                return self.objective_verdicts(kwargs)
            if name == "select_fragments":
                return self.select_fragments(kwargs, context, depth=depth, parent=parent)
            if name == "rlm_query":
                return self.child_rlm(
                    self.checked_prompt(kwargs.get("prompt")),
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

    def checked_prompt(self, value: Any) -> str:
        """A prompt whose fragment markers name only this run's context files: REPL code
        must not make a worker read anything else."""
        prompt = _prompt(value)
        try:
            refs = fragments.refs(prompt)
        except fragments.FragmentError as exc:
            raise SandboxCallError(str(exc)) from exc
        for ref in refs:
            if ref["path"] not in self.fragment_paths:
                raise SandboxCallError(
                    f"a fragment names {ref['path']}, which is not this run's context; make "
                    "fragments with context.fragment(a, b) or context.chunks(...)"
                )
        return prompt

    def select_fragments(
        self, kwargs: dict[str, Any], context: RlmContext, *, depth: int, parent: str
    ) -> list[fragindex.Selected]:
        """BM25 over the context's passages (runs.engine.fragindex), built on first use and cached
        by the context's sha256; Env.SelectFragments records the choice and the scores."""
        query, k = kwargs.get("query"), kwargs.get("k", 8)
        if not isinstance(query, str) or not query.strip():
            raise SandboxCallError("select_fragments(query, k) needs a non-empty query string")
        if not isinstance(k, int) or not 1 <= k <= 1000:
            raise SandboxCallError("select_fragments(query, k): k must be an int from 1 to 1000")
        if context.index_path is None or not context.sha256:
            raise SandboxCallError(
                "select_fragments works on the run's own context; this child RLM's context "
                "is a piece of text: search it with context.find or context.search"
            )
        try:
            selection = fragindex.select(
                Path(settings.DATA_DIR),
                context.path,
                context.index_path,
                context.sha256,
                query,
                k,
            )
        except fragindex.FragmentIndexError as exc:
            raise SandboxCallError(str(exc)) from exc
        self.emitter.instant(
            "Env.SelectFragments",
            parent=parent,
            depth=depth,
            payload=query,
            query=query[:500],
            k=k,
            chosen=selection["fragments"],
            passages=selection["passages"],
            method="bm25",
            # How the index was had and how long it took: not part of the decision, so
            # kept out of what frlm_diff compares (attributes starting with "_").
            _index=selection["index"],
            _build_ms=selection["build_ms"],
            _query_ms=selection["query_ms"],
        )
        return selection["fragments"]

    def subqueries(
        self,
        prompts_: list[str],
        depth: int,
        parent: str,
        tier: Any = None,
        check: Callable[[str], verify.CheckVerdict] | None = None,
    ) -> list[str]:
        if not prompts_:
            return []
        outcomes = self.fanout.run_batch(
            prompts_, depth=depth, parent=parent, tier=tier, check=check
        )
        return self.replies(outcomes)

    def replies(self, outcomes: list[Any]) -> list[str]:
        failed = [o for o in outcomes if o.status == "error"]
        if failed and len(failed) == len(outcomes):
            raise FanoutAbort(
                f"every sub-query of a batch of {len(outcomes)} failed; first: {failed[0].error}"
            )
        return [o.reply() for o in outcomes]

    def checked_by_repl(
        self, prompts_: list[str], depth: int, parent: str, tier: Any
    ) -> dict[str, Any]:
        """A batch whose replies the REPL checks with its own function (validate=f): the
        replies go back with a handle; objective_verdicts takes the function's verdicts."""
        if not prompts_:
            return {"handle": "", "replies": [], "ok": []}
        outcomes = self.fanout.run_batch(
            prompts_, depth=depth, parent=parent, tier=tier, defer_check=True
        )
        return {
            "handle": self.fanout.last_handle,
            "replies": self.replies(outcomes),
            "ok": [pos for pos, o in enumerate(outcomes) if o.status == "ok"],
        }

    def objective_verdicts(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """One round of the REPL's verdicts: [[position, passed, reason], ...]."""
        handle, raw = kwargs.get("handle"), kwargs.get("verdicts")
        if not isinstance(handle, str) or not isinstance(raw, list):
            raise SandboxCallError("objective_verdicts takes a handle and a list of verdicts")
        verdicts: dict[int, verify.CheckVerdict] = {}
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], int)):
                raise SandboxCallError("each verdict is [position, passed, reason]")
            pos, passed, reason = item
            verdicts[pos] = verify.CheckVerdict(bool(passed), "function", str(reason)[:500])
        outcomes, again = self.fanout.apply_verdicts(handle, verdicts)
        return {"replies": self.replies(outcomes), "recheck": again}

    def child_rlm(
        self, prompt: str, child_context: Any, *, depth: int, parent: str, context: RlmContext
    ) -> str:
        """A child RLM one level deeper; at the depth limit it is a plain sub-query."""
        fragment = child_context.get("fragment") if isinstance(child_context, dict) else None
        if fragment is not None:
            try:
                ref = fragments.parse_ref(json.dumps(fragment))
            except fragments.FragmentError as exc:
                raise SandboxCallError(f"rlm_query(context=...): {exc}") from exc
            if ref["path"] not in self.fragment_paths:
                raise SandboxCallError("rlm_query(context=...) names a file outside this run")
        elif child_context is not None and not isinstance(child_context, str):
            child_context = str(child_context)
        if depth + 1 > self.policy.max_depth:
            self.emitter.instant(
                "SubQuery.Retry",
                parent=parent,
                depth=depth,
                status="rejected",
                reason=f"rlm_query at depth {depth + 1} exceeds policy.max_depth="
                f"{self.policy.max_depth}; answered as llm_query",
            )
            if fragment is not None:
                full = f"{prompt}\n\n{fragments.MARKER_TEXT.format(json.dumps(fragment))}"
            else:
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
            sub = context
            if fragment is not None:
                sub = _fragment_file(ref, Path(tmp) / "context.txt")
            elif child_context is not None:
                path = Path(tmp) / "context.txt"
                path.write_text(child_context, encoding="utf-8")
                sub = RlmContext(path, len(child_context))
            try:
                answer = self.rlm(prompt, sub, depth=depth + 1, parent=span.span_id)
            except RunAbort as exc:
                span.end("error", error=str(exc))
                raise
            finally:
                self.fragment_paths.discard(str(sub.path.resolve()) if sub is not context else "")
        span.end("ok", payload=answer)
        return answer


def objective_check(validate: Any) -> Callable[[str], verify.CheckVerdict] | None:
    """The conductor's check for validate= (a JSON schema or a regex), or None without
    one; a bad schema or pattern is the program's error, said to the REPL."""
    if validate is None:
        return None
    try:
        return verify.objective_check(validate)
    except ValueError as exc:
        raise SandboxCallError(str(exc)) from exc


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


def _fragment_file(ref: fragments.FragmentRef, target: Path) -> RlmContext:
    """A child RLM's context made of one fragment: its bytes copied (checked against the
    sha256), so the child's REPL reads a file of its own."""
    try:
        text = fragments.read(ref)
    except fragments.FragmentError as exc:
        raise SandboxCallError(f"rlm_query(context=...): {exc}") from exc
    target.write_text(text, encoding="utf-8")
    return RlmContext(target, len(text))
