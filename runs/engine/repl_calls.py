"""The REPL functions the sandbox calls back: llm_query, llm_query_batched (with the REPL's
own check: objective_verdicts), select_fragments and rlm_query. Sub-queries fan out through
the run's Fanout; a child RLM runs through the conductor one level deeper."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from runs.engine import fragindex
from runs.engine.fanout import Fanout, FanoutAbort, LimitExceeded, Outcome, Totals
from runs.engine.finish import RunAbort
from runs.engine.policy import Policy
from runs.engine.rlm_context import RlmContext, child_context
from runs.sandbox import SandboxCallError
from runs.trust import checker, objective
from traces.emitter import Emitter
from workers import fragments


class RunsRlm(Protocol):
    """Conductor.rlm: answers a question as an RLM of its own over a context."""

    def __call__(self, question: str, context: RlmContext, *, depth: int, parent: str) -> str: ...


@dataclass(kw_only=True, eq=False)
class ReplCalls:
    """Serves the REPL functions of one run's RLMs (the root and its children)."""

    fanout: Fanout
    emitter: Emitter
    policy: Policy
    totals: Totals
    rlm: RunsRlm
    # The name of the model a child RLM's turns go to (the root model can be swapped for a
    # live one on resume, so it is asked each time).
    root_model: Callable[[], str]
    # Files a fragment marker may name: the run's context and its children's.
    fragment_paths: set[str] = field(default_factory=set, init=False)
    # Why the run cannot go on, found while serving a call; the conductor raises it once
    # the cell returns.
    abort: RunAbort | None = field(default=None, init=False)
    # The run's objective checks that ran out of time: past a few, its checks fail untried.
    slow_checks: checker.SlowChecks = field(default_factory=checker.SlowChecks, init=False)

    def serve(
        self, name: str, kwargs: dict[str, Any], *, depth: int, parent: str, context: RlmContext
    ) -> Any:
        """Serve a REPL function. Limit breaches become errors in the REPL code; a run that
        cannot go on (no workers, cancelled) is aborted after the cell returns."""
        try:
            self.check_model(name, kwargs.get("model"))
            tier = kwargs.get("tier")
            check = objective_check(kwargs.get("validate"), self.slow_checks)
            if name == "llm_query":
                prompt = self.checked_prompt(kwargs.get("prompt"))
                # One call's timeout is its marker: a merge that timed out falls back on
                # the partial answers it had (runs/sandbox/patterns.py's combine).
                return self.subqueries([prompt], depth, parent, tier, check, one=True)[0]
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

    def check_model(self, name: str, model: Any) -> None:
        """model= (code written for the original RLM names one) is taken when it names the
        model the call goes to: sub-queries go to the run's worker model, a child RLM's turns
        to its root model, both chosen at launch."""
        if model is None or name not in ("llm_query", "llm_query_batched", "rlm_query"):
            return
        which, wanted = (
            ("root", self.root_model()) if name == "rlm_query" else ("worker", self.worker_model())
        )
        if model != wanted:
            raise SandboxCallError(
                f"{name}(model={str(model)[:80]!r}): this run's {which} model is {wanted!r}, "
                f"chosen at launch; drop model=, or launch the run with the {which} model "
                f"you want (the launcher's {which} model, or frlm_run --{which}-model "
                "openai:NAME)"
            )

    def worker_model(self) -> str:
        return self.fanout.worker_model.model

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
        check: Callable[[str], objective.CheckVerdict] | None = None,
        *,
        one: bool = False,
    ) -> list[str]:
        if not prompts_:
            return []
        outcomes = self.fanout.run_batch(
            prompts_, depth=depth, parent=parent, tier=tier, check=check
        )
        return self.replies(outcomes, markers_fail=not one)

    def replies(self, outcomes: list[Outcome], *, markers_fail: bool = True) -> list[str]:
        # No answer at all: the run fails rather than let the program make one up from
        # markers. A batch that all timed out went on, and its run "succeeded" with an
        # answer from nothing (a review); so did one whose answers no check accepted (a
        # redundant tier with one worker to ask left each unresolved, a review). One
        # llm_query's timeout or verdict stays its marker: the program may handle it, and so
        # does a batch of one, with validate=f or not (a review found the two disagreeing).
        markers_fail = markers_fail and len(outcomes) > 1
        failing = ("error",) + (("timeout", "rejected", "unresolved") if markers_fail else ())
        failed = [o for o in outcomes if o.status in failing]
        if failed and len(failed) == len(outcomes):
            first = failed[0]
            who = f"worker {first.said_by} of {first.venue}: " if first.said_by else ""
            raise FanoutAbort(
                f"every sub-query of a batch of {len(outcomes)} failed; first: {who}{first.error}"
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
        verdicts: dict[int, objective.CheckVerdict] = {}
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], int)):
                raise SandboxCallError("each verdict is [position, passed, reason]")
            pos, passed, reason = item
            verdicts[pos] = objective.CheckVerdict(bool(passed), "function", str(reason)[:500])
        outcomes, again = self.fanout.apply_verdicts(handle, verdicts)
        return {"replies": self.replies(outcomes), "recheck": again}

    def child_rlm(
        self, prompt: str, value: Any, *, depth: int, parent: str, context: RlmContext
    ) -> str:
        """A child RLM one level deeper; at the depth limit it is a plain sub-query."""
        child = child_context(value, self.fragment_paths)
        if depth + 1 > self.policy.max_depth:
            self.emitter.instant(
                "SubQuery.Retry",
                parent=parent,
                depth=depth,
                status="rejected",
                reason=f"rlm_query at depth {depth + 1} exceeds policy.max_depth="
                f"{self.policy.max_depth}; answered as llm_query",
            )
            return self.subqueries([child.inline(prompt)], depth, parent, one=True)[0]
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
            try:
                sub = child.file(context, Path(tmp) / "context.txt")
            except SandboxCallError as exc:  # its fragment failed its checks: span ended
                span.end("error", error=str(exc))
                raise
            try:
                answer = self.rlm(prompt, sub, depth=depth + 1, parent=span.span_id)
            except RunAbort as exc:
                span.end("error", error=str(exc))
                raise
            finally:
                self.fragment_paths.discard(str(sub.path.resolve()) if sub is not context else "")
        span.end("ok", payload=answer)
        return answer


def objective_check(
    validate: Any, slow: checker.SlowChecks | None = None
) -> Callable[[str], objective.CheckVerdict] | None:
    """The conductor's check for validate= (a JSON schema or a regex), or None without
    one; a bad schema or pattern is the program's error, said to the REPL. Its verdicts
    come from a process of their own, with a time limit (runs/trust/checker.py)."""
    if validate is None:
        return None
    try:
        return checker.Isolated(validate, slow or checker.SlowChecks())
    except ValueError as exc:
        raise SandboxCallError(str(exc)) from exc


def _prompt(value: Any) -> str:
    if not isinstance(value, str):
        raise SandboxCallError(f"a prompt must be a string, got {type(value).__name__}")
    return value
