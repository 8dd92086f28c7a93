"""The root model's side of the RLM loop: one turn (its tokens reserved, the call, the cost
settled) and the folding of older turns once the conversation outgrows policy.fold_tokens."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from runs.engine import folding
from runs.engine.fanout import Fanout, FanoutAbort, LimitExceeded, Totals
from runs.engine.finish import RunAbort, partial_reason
from runs.engine.policy import Policy
from runs.models import Run
from runs.sandbox import Sandbox
from runs.trust.accounts import price_of
from runs.trust.budget import BudgetRefused
from traces.emitter import Emitter
from workers.backends import ChatResult, ModelError, ModelSpec, chat

log = logging.getLogger(__name__)

ROOT_POLL_S = 0.25  # how often a root call's wait asks whether the run was cancelled


class _Stopped(Exception):
    """The run was cancelled while its root model answered."""


Subqueries = Callable[[list[str], int, str], list[str]]


@dataclass(kw_only=True, eq=False)
class RootTurns:
    """The root model's turns of one run; ``model`` is the one the next turn calls (a what-if
    replay swaps in the live model after its cassette)."""

    model: ModelSpec
    run_id: str
    policy: Policy
    emitter: Emitter
    fanout: Fanout
    totals: Totals
    subqueries: Subqueries
    # Whether the run was cancelled (a Redis error is no): asked while the root model
    # answers, so a cancel ends the run within ROOT_POLL_S, not at the call's timeout.
    stop: Callable[[], bool] = lambda: False

    def decode(self, messages: list[dict[str, str]], *, depth: int, parent: str, turn: int) -> str:
        """One root-model call, paid from the run's accounts; its reply joins the
        conversation."""
        accounts_ = self.fanout.accounts
        model = self.model.model or self.model.kind
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
            reason = partial_reason(self.totals, self.fanout.accounts, answered=False)
            raise RunAbort(reason, status=Run.Status.PARTIAL) from None
        # The conversation the model is sent is the span's input (a JSON list of chat
        # messages), so exports show what the model saw (traces/otlp_semconv.py).
        span = self.emitter.start(
            "Run.Decode",
            parent=parent,
            depth=depth,
            payload=json.dumps(messages, ensure_ascii=False),
            turn=turn,
            model=self.model.label,
        )
        accounts_.reserved(reservation, parent=span.span_id, depth=depth)
        try:
            reply = self._answer(messages)
        except ModelError as exc:
            accounts_.release(reservation, parent=span.span_id, depth=depth)
            span.end("error", error=str(exc))
            raise RunAbort(f"the root model failed: {exc}") from exc
        except _Stopped:
            accounts_.release(reservation, parent=span.span_id, depth=depth)
            span.end("cancelled", error="the run was cancelled while the root model answered")
            raise RunAbort("the run was cancelled", status=Run.Status.CANCELLED) from None
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
            cut_from=reply.cut_from or None,
        )
        messages.append({"role": "assistant", "content": reply.text})
        return reply.text

    def _answer(self, messages: list[dict[str, str]]) -> ChatResult:
        """The root model's reply, called on a thread of its own while this one asks `stop`
        every ROOT_POLL_S: a cancel during a slow call waited out the call's timeout and
        tries, minutes, with the run still `running` (a review). A call left behind runs to
        its own end; its reply is dropped, and what it would cost is not paid."""
        call: Future[ChatResult] = Future()

        def run() -> None:
            try:
                call.set_result(chat(self.model, messages))
            except BaseException as exc:  # the caller's to raise (ModelError, or a bug)
                call.set_exception(exc)
            finally:
                # Its kept-alive connection ends with it: a root turn is seconds of a model's
                # time, a connection on loopback a tenth of a millisecond.
                from workers.http_transport import close_thread_connections

                close_thread_connections()

        threading.Thread(target=run, name=f"root-call-{self.run_id}", daemon=True).start()
        while True:
            try:
                return call.result(timeout=ROOT_POLL_S)
            except TimeoutError:
                if self.stop():
                    raise _Stopped from None

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
        summaries, how = self.summaries(text, depth=depth, parent=span.span_id)
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

    def summaries(self, text: str, *, depth: int, parent: str) -> tuple[list[str], str]:
        """Summaries of folded text made by sub-queries, or else a cut of it: (summaries,
        how they were made)."""
        pieces = folding.parts(text)
        try:
            replies = self.subqueries(
                [folding.FOLD_HEADER + piece for piece in pieces], depth, parent
            )
        except (LimitExceeded, FanoutAbort) as exc:
            log.warning("run %s: folding by sub-queries failed (%s); cut instead", self.run_id, exc)
            replies = []
        summaries = [r for r in replies if r.strip() and not r.startswith("[frlm:")]
        how = "sub-queries" if summaries else "cut"
        if not summaries:
            summaries = [folding.fallback_summary(text)]
        return summaries, how
