"""A run's money and trust accounts, as the conductor keeps them: every dispatch reserves
its estimated cost first (Budget.Reserve), settles what it cost on return (Budget.Settle),
raises Budget.Alert at 80% of a cap, and every reply whose verdict is known gets a receipt
in the run's chain (Receipt.Emit), paid only when it was not judged wrong.

runs.trust.budget and runs.trust.receipts are plain objects; this module is where their
figures become trace events, so the fanout and the conductor say "reserve", "settle", "receipt" and
nothing more."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from frlm_web.money import ZERO, money, money_str
from runs.engine.policy import Policy, provider_caps
from runs.trust import budget, receipts
from runs.trust.budget import Budget, BudgetRefused, Caps, Price
from traces.emitter import Emitter, sha256_text
from workers.pricing import payee_price

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# Reply tokens assumed before a run has seen any: what a sub-query answer usually takes.
DEFAULT_TOKENS_OUT = 256


class ReceiptSummary(TypedDict):
    count: int
    paid: str  # exact dollars, frlm_web.money.money_str
    cost: str
    verdicts: dict[str, int]
    head: str | None


class LostWorker(TypedDict):
    """A worker that left while it held the run's work (its alive line dropped, its presence
    lapsed, or its gateway connection closed)."""

    worker_id: str
    venue: str
    held: int  # attempts it held then: each was tried again elsewhere while tries remained


class RunAccountsFigures(TypedDict):
    """What Run.accounts holds when the run ends."""

    verification: dict[str, Any]
    hedges: int  # duplicates sent for stragglers (not counted as verification)
    lost: NotRequired[list[LostWorker]]  # workers lost mid-run (absent from older runs)
    budget: budget.BudgetFill
    receipts: ReceiptSummary
    exhausted: str | None
    prices: NotRequired[dict[str, str]]  # model -> where the conductor's price came from


@dataclass(frozen=True)
class Payee:
    """Who did a piece of work, and what it claimed: what a receipt needs of a reply."""

    span: str  # the sub-query's Submit span
    attempt: str  # the attempt id the worker signed ("<index>.<attempt>")
    worker_id: str
    worker_key: str
    prompt: str
    text: str
    tokens_in: int
    tokens_out: int
    cost: Decimal
    price: Price
    sig: str  # the worker's signature over its result claim, verified on arrival


def provider_of(worker: dict[str, Any], asked: str) -> str:
    """A worker's provider for the budget and its list price: the model the job asked for
    (a price table's key), else the first it serves. The first it listed, its own choice,
    priced a reply before: an unpriced name first left every claim unchecked (a review)."""
    models = worker.get("models") or []
    return asked or (str(models[0]) if models else "")


def price_of(worker: dict[str, Any], model: str) -> Price:
    """The worker's own price when it announced one, else its model's list price
    (workers.pricing), else nothing."""
    price_in = money(worker.get("price_in") or 0, what="a worker's price_in")
    price_out = money(worker.get("price_out") or 0, what="a worker's price_out")
    paid = payee_price(price_in, price_out, model)
    return Price(paid.per_1k_in, paid.per_1k_out) if paid else Price(ZERO, ZERO)


class RunAccounts:
    """One run's budget and receipt chain, emitting as they move. Safe for the
    conductor's threads (the budget and the chain lock themselves; the tallies here too)."""

    def __init__(self, run_id: str, policy: Policy, emitter: Emitter) -> None:
        self.run_id = run_id
        self.emitter = emitter
        self.budget = Budget(
            run_id,
            Caps(
                run=policy.budget_usd or None,
                subquery=policy.subquery_budget_usd or None,
                providers=provider_caps(policy.provider_budgets),
            ),
        )
        self.chain = receipts.ReceiptChain(run_id)
        # Budget events only where a cap makes them worth reading: without one the budget
        # still keeps the figures (Run.accounts), at no cost to the trace.
        self.announce = bool(
            policy.budget_usd or policy.subquery_budget_usd or policy.provider_budgets
        )
        self.capped_providers: set[str] = set()  # providers whose cap refused a dispatch
        self.exhausted: str | None = None  # why the run's cap stopped dispatching
        self._lock = threading.Lock()
        self._countersign: Ed25519PrivateKey | None = None
        # Running mean of reply tokens and its count, for root turns ("") and sub-queries
        # apart: a root model writes programs, a worker short answers.
        self._tokens_out = {True: (DEFAULT_TOKENS_OUT, 0), False: (DEFAULT_TOKENS_OUT, 0)}
        self._receipts: ReceiptSummary = {
            "count": 0,
            "paid": "0",
            "cost": "0",
            "verdicts": {},
            "head": None,
        }

    # --- the budget -----------------------------------------------------------------------
    def tokens_out_estimate(self, *, root: bool = False) -> int:
        return max(1, round(self._tokens_out[root][0]))

    def reserve(
        self,
        *,
        subquery: str,
        provider: str,
        worker_id: str,
        tokens_in: int,
        price: Price,
        parent: str | None,
        depth: int,
    ) -> budget.Reservation:
        """Reserve one dispatch's estimated cost (`subquery` "" for a root turn, which no
        sub-query cap covers); announce it with `reserved` once its span exists. A refusal
        is recorded here and re-raised: BudgetRefused.scope says what the caller does (run:
        stop, provider: route elsewhere, subquery: give up on it). A refusal by the run's
        cap marks the run exhausted, and nothing is reserved after that."""
        if self.exhausted:
            raise BudgetRefused(self._refusal(subquery, provider, worker_id), "run", self.run_id, 0)
        try:
            return self.budget.reserve(
                subquery=subquery,
                provider=provider,
                worker_id=worker_id,
                tokens_in=tokens_in,
                tokens_out=self.tokens_out_estimate(root=not subquery),
                price=price,
            )
        except BudgetRefused as refused:
            self.emitter.instant(
                "Budget.Reserve",
                parent=parent,
                depth=depth,
                status="rejected",
                attrs=dict(refused.attrs),
            )
            if refused.scope == "run":
                self.exhausted = refused.attrs["reason"]
            elif refused.scope == "provider":
                self.capped_providers.add(provider)
            raise

    def _refusal(self, subquery: str, provider: str, worker_id: str) -> budget.ReserveAttrs:
        assert self.exhausted is not None
        return {
            "reservation": None,
            "subquery": subquery,
            "provider": provider,
            "worker": worker_id,
            "tokens_in_est": 0,
            "tokens_out_est": 0,
            "price_in": "0",
            "price_out": "0",
            "amount": "0",
            "ok": False,
            "refused_by": "run",
            "reason": self.exhausted,
            "run_committed": self.budget.fill(top=0)["run"]["committed"],
            "run_cap": self.budget.caps.run,
        }

    def reserved(self, reservation: budget.Reservation, *, parent: str | None, depth: int) -> None:
        """The Budget.Reserve event of a reservation (and any alert it raised)."""
        if not self.announce:
            return
        self.emitter.instant(
            "Budget.Reserve", parent=parent, depth=depth, attrs=dict(reservation.attrs)
        )
        self._alerts(reservation.alerts, parent, depth)

    def settle(
        self,
        reservation: budget.Reservation,
        *,
        tokens_in: int,
        tokens_out: int,
        cost: Decimal | None,
        parent: str | None,
        depth: int,
    ) -> Decimal:
        """Settle the reservation; what is paid (its caps may cut a reply's cost)."""
        settlement = self.budget.settle(
            reservation.id, tokens_in=tokens_in, tokens_out=tokens_out, cost=cost
        )
        with self._lock:
            root = not reservation.subquery
            mean, n = self._tokens_out[root]
            self._tokens_out[root] = (mean + (tokens_out - mean) / (n + 1), n + 1)
        if self.announce:
            self.emitter.instant(
                "Budget.Settle", parent=parent, depth=depth, attrs=dict(settlement.attrs)
            )
            self._alerts(settlement.alerts, parent, depth)
        return money(settlement.cost)

    def release(self, reservation: budget.Reservation, *, parent: str | None, depth: int) -> None:
        settlement = self.budget.release(reservation.id)
        if not self.announce:
            return
        self.emitter.instant(
            "Budget.Settle", parent=parent, depth=depth, attrs=dict(settlement.attrs)
        )

    def _alerts(self, alerts: list[budget.AlertAttrs], parent: str | None, depth: int) -> None:
        for alert in alerts:
            self.emitter.instant("Budget.Alert", parent=parent, depth=depth, attrs=dict(alert))

    # --- receipts -------------------------------------------------------------------------
    def _conductor_key(self) -> Ed25519PrivateKey:
        """The key this run's receipts are countersigned with, read once per run: its file
        was read, decoded and made a key again for every receipt (3 us idle, 3% of the
        conductor's profile under the 1 ms fanout), and a run's chain is countersigned by
        one key even if the file is replaced while it runs."""
        if self._countersign is None:
            self._countersign = receipts.conductor_key()
        return self._countersign

    def receipt(self, payee: Payee, verdict: str, *, depth: int) -> None:
        """The receipt of one reply once its verdict is known, countersigned by this
        conductor and emitted under the sub-query's span."""
        # Issued and tallied in one step, so the summary's head is the chain's last hash
        # whichever thread's event goes out first: frlm_receipts checks the chain against it.
        with self._lock:
            attrs = self.chain.issue(
                span=payee.span,
                attempt=payee.attempt,
                worker=payee.worker_id,
                input_sha256=sha256_text(payee.prompt),
                output_sha256=sha256_text(payee.text),
                tokens_in=payee.tokens_in,
                tokens_out=payee.tokens_out,
                price_in=payee.price.per_1k_in,
                price_out=payee.price.per_1k_out,
                cost=payee.cost,
                verdict=verdict,
                worker_sign=lambda _receipt: payee.sig,
                worker_key=payee.worker_key,
                conductor_key=self._conductor_key(),
                # The fanout verified this signature over this claim when the reply arrived.
                worker_sig_checked=True,
            )
            summary = self._receipts
            summary["count"] += 1
            for key in ("paid", "cost"):
                summary[key] = money_str(money(summary[key]) + money(attrs["receipt"][key]))
            summary["verdicts"][verdict] = summary["verdicts"].get(verdict, 0) + 1
            summary["head"] = attrs["hash"]
        self.emitter.instant(
            receipts.RECEIPT_EVENT,
            parent=payee.span,
            depth=depth,
            # The money stays in attrs: the event's cost column counts model calls only.
            worker_id=payee.worker_id,
            attrs=dict(attrs),
        )

    def figures(
        self, verification: dict[str, Any], hedges: int, lost: list[LostWorker]
    ) -> RunAccountsFigures:
        with self._lock:
            summary: ReceiptSummary = {
                **self._receipts,
                "verdicts": dict(self._receipts["verdicts"]),
            }
        return {
            "verification": verification,
            "hedges": hedges,
            "lost": lost,
            "budget": self.budget.fill(top=5),
            "receipts": summary,
            "exhausted": self.exhausted,
        }
