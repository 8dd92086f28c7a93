"""A sub-query's money, against the run's accounts (runs.trust.accounts.RunAccounts): each
attempt reserves its estimated cost before it leaves, the reservation is settled at what the
reply cost or released when nothing came of it, and each reply is paid by its verdict with a
countersigned receipt, only when it was not judged wrong."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from frlm_web.money import ZERO, cost_at
from runs.engine.fanout.state import Flight, Roster, Scope, Target
from runs.trust import accounts
from runs.trust.budget import Reservation
from workers import fragments
from workers.jobs import Result

# The most tokens a character of a prompt or reply can be (a byte-level tokenizer's four
# for a four-byte character), and what a chat template adds around them.
TOKENS_PER_CHAR = 4
TEMPLATE_TOKENS = 64


def fair_tokens(result: Result, prompt: str) -> tuple[int, int]:
    """The token counts of a reply the run believes: the worker's, never more than its
    prompt and text could hold (TOKENS_PER_CHAR tokens a character, and a template's
    worth). A review's four one-line replies claimed a billion tokens each, and the run's
    totals read four billion."""
    prompt_chars = 4 * fragments.prompt_tokens(prompt)  # its fragments read in
    read = TOKENS_PER_CHAR * prompt_chars + TEMPLATE_TOKENS
    wrote = TOKENS_PER_CHAR * len(str(result.get("text", ""))) + TEMPLATE_TOKENS
    return (
        min(int(result.get("tokens_in", 0)), read),
        min(int(result.get("tokens_out", 0)), wrote),
    )


@dataclass(kw_only=True, eq=False)
class Spending:
    scope: Scope
    roster: Roster
    accounts: accounts.RunAccounts

    def reserve(self, flight: Flight, target: Target) -> Reservation:
        """Reserve the attempt's estimated cost before it leaves, against the run's, the
        sub-query's and the provider's caps; a cap that refuses raises BudgetRefused
        (attempts.Attempts.refused says what becomes of the attempt)."""
        worker = self.roster.workers.get(target.worker_id, {})
        provider = accounts.provider_of(worker, self.scope.worker_model.model or "")
        return self.accounts.reserve(
            # Copies count against the sub-query they copy: the cap is per question.
            subquery=str(flight.original or flight.outcome.index),
            provider=provider,
            worker_id=target.worker_id,
            tokens_in=fragments.prompt_tokens(flight.prompt),
            price=accounts.price_of(worker, provider),
            parent=flight.span.span_id if flight.span else self.scope.parent,
            depth=self.scope.depth,
        )

    def hold(self, flight: Flight, reservation: Reservation) -> None:
        """The attempt, now prepared (its span open), carries its reservation while it is out."""
        flight.reservation = reservation
        self.accounts.reserved(reservation, parent=flight.span.span_id, depth=self.scope.depth)

    def close(self, flight: Flight, spent: Result | None) -> None:
        """The attempt is back or given up: its reservation is settled at what the reply cost,
        or released when nothing came of it."""
        reservation, flight.reservation = flight.reservation, None
        if reservation is None:
            return
        where = {"parent": flight.span.span_id if flight.span else None, "depth": self.scope.depth}
        if spent is None:
            self.accounts.release(reservation, **where)
        else:
            tokens_in, tokens_out = spent.get("counted") or (
                int(spent.get("tokens_in", 0)),
                int(spent.get("tokens_out", 0)),
            )
            # What the caps let it be paid: its receipt and the run's totals say that.
            spent["cost"] = self.accounts.settle(
                reservation,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=spent.get("cost"),
                **where,
            )

    def worker_price(self, wid: str) -> accounts.Price:
        """The price a worker's reply is paid at: its own announced one, else the list price
        of the model the job asked for (accounts.price_of)."""
        worker = self.roster.workers.get(wid, {})
        return accounts.price_of(
            worker, accounts.provider_of(worker, self.scope.worker_model.model or "")
        )

    def fair_cost(self, result: Result, prompt: str) -> Decimal:
        """What a reply costs the run: the worker's claim (its report, not its signed word),
        never more than its price makes of its token counts, and those never more than its
        prompt and reply could hold (TOKENS_PER_CHAR tokens a character, and a template's
        worth). A review had a claim of 1e400 dollars paid. With no price known (a worker
        that announced none, its model in no price table) a claim cannot be weighed and is
        not paid: a review had $999,999 paid that way, runs with a $1 budget included."""
        claimed = result.get("cost") or ZERO
        price = self.worker_price(str(result.get("worker_id", "")))
        if not price.per_1k_in and not price.per_1k_out:
            return ZERO
        tokens_in, tokens_out = result.get("counted") or fair_tokens(result, prompt)
        return min(claimed, cost_at(price.per_1k_in, price.per_1k_out, tokens_in, tokens_out))

    def pay(self, flight: Flight) -> None:
        """The receipt of a reply by its verdict (runs.trust.accounts.RunAccounts.receipt)."""
        result = flight.result
        if result is None or flight.span is None:
            return
        # Whose signed reply it is: the outcome may since name a recheck's or a validator's.
        wid = str(result.get("worker_id", ""))
        key = self.roster.keys.get(wid)
        if key is None:
            return
        self.accounts.receipt(
            accounts.Payee(
                span=flight.span.span_id,
                attempt=str(result.get("sq_id", "")),
                worker_id=wid,
                worker_key=key,
                prompt=flight.prompt,
                text=str(result.get("text", "")),
                tokens_in=int(result.get("tokens_in", 0)),
                tokens_out=int(result.get("tokens_out", 0)),
                cost=result.get("cost") or ZERO,
                price=self.worker_price(wid),
                sig=str(result.get("sig", "")),
            ),
            flight.verdict,
            depth=self.scope.depth,
        )
