"""A run's budget: caps per run, per sub-query and per provider (a model endpoint
with its price table); every dispatch reserves its estimated cost first and settles its
actual cost on return.

Nothing here emits: each call returns the attrs of the event the caller emits
(Budget.Reserve, Budget.Settle, Budget.Alert), so the budget stays a plain object a fanout,
a bench or a test can drive. One lock makes it safe for the threads of one conductor."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal, NotRequired, TypedDict

from frlm_web.money import ZERO, cost_at, money, money_str

Scope = Literal["run", "provider", "subquery"]
# The share of a cap at which the budget raises its one alert for that cap.
ALERT_AT = 0.8


@dataclass(frozen=True)
class Caps:
    """Dollar caps, exact (floats given are taken by their shortest spelling); None (or a
    provider not named) is uncapped. The sub-query cap holds for each sub-query over all
    its attempts and replicas together."""

    run: Decimal | None = None
    subquery: Decimal | None = None
    providers: Mapping[str, Decimal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        named = {"run": self.run, "subquery": self.subquery}
        named.update({f"provider {k!r}": v for k, v in self.providers.items()})
        exact: dict[str, Decimal | None] = {}
        bad = []
        for name, value in named.items():
            try:
                exact[name] = None if value is None else money(value)
            except ValueError:
                bad.append(f"{name} cap {value!r}")
        if bad:
            raise ValueError(f"budget caps must be dollars, 0 or more: {', '.join(bad)}")
        object.__setattr__(self, "run", exact["run"])
        object.__setattr__(self, "subquery", exact["subquery"])
        object.__setattr__(self, "providers", {k: exact[f"provider {k!r}"] for k in self.providers})


@dataclass(frozen=True)
class Price:
    """Dollars per 1,000 tokens in and out: a worker's (Worker.price_in / price_out) or a
    model's (workers.pricing.price_table)."""

    per_1k_in: Decimal
    per_1k_out: Decimal

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_1k_in", money(self.per_1k_in, what="a price in"))
        object.__setattr__(self, "per_1k_out", money(self.per_1k_out, what="a price out"))


def estimate_cost(tokens_in: int, tokens_out: int, price: Price) -> Decimal:
    return cost_at(price.per_1k_in, price.per_1k_out, tokens_in, tokens_out)


class ReserveAttrs(TypedDict):
    """What a Budget.Reserve event carries (status ok, or rejected when refused)."""

    reservation: str | None
    subquery: str
    provider: str
    worker: str
    tokens_in_est: int
    tokens_out_est: int
    price_in: str  # dollars, frlm_web.money.money_str
    price_out: str  # dollars, frlm_web.money.money_str
    amount: str  # dollars, frlm_web.money.money_str
    ok: bool
    refused_by: str | None  # run, provider or subquery
    reason: str
    run_committed: str  # dollars, frlm_web.money.money_str
    run_cap: str | None


class SettleAttrs(TypedDict):
    """What a Budget.Settle event carries; released is True when nothing was spent (the
    sub-query was cancelled or never sent)."""

    reservation: str
    subquery: str
    provider: str
    worker: str
    reserved: str  # dollars, frlm_web.money.money_str
    tokens_in: int
    tokens_out: int
    cost: str  # dollars, frlm_web.money.money_str
    released: bool
    run_settled: str  # dollars, frlm_web.money.money_str
    run_committed: str  # dollars, frlm_web.money.money_str
    run_cap: str | None
    # A worker's reply the caps cut: what it asked, where `cost` is what it was paid.
    claimed: NotRequired[str]


class AlertAttrs(TypedDict):
    """What a Budget.Alert event carries: one per cap, the first time its committed
    spending reaches ALERT_AT of it."""

    scope: str
    key: str
    cap: str
    committed: str  # dollars, frlm_web.money.money_str
    fraction: float
    threshold: float


class CapFigures(TypedDict):
    """One cap for the fill view: reserved (in flight), settled (spent) and committed (both)."""

    scope: str
    key: str
    cap: str | None
    reserved: str  # dollars, frlm_web.money.money_str
    settled: str  # dollars, frlm_web.money.money_str
    committed: str  # dollars, frlm_web.money.money_str
    fraction: float | None  # committed / cap


class BudgetFill(TypedDict):
    run: CapFigures
    providers: list[CapFigures]
    subqueries: list[CapFigures]  # the most committed ones, at most `top`
    refused: int
    alerts: list[AlertAttrs]


class BudgetRefused(Exception):
    """A reservation would pass a cap. `scope` says which (run: stop dispatching; provider:
    route elsewhere; subquery: no more attempts for it), `attrs` is the rejected
    Budget.Reserve event's data."""

    def __init__(self, attrs: ReserveAttrs, scope: Scope, key: str, cap: Decimal) -> None:
        super().__init__(attrs["reason"])
        self.attrs = attrs
        self.scope = scope
        self.key = key
        self.cap = cap


@dataclass(frozen=True)
class Reservation:
    id: str
    subquery: str
    provider: str
    worker_id: str
    amount: str  # dollars, frlm_web.money.money_str
    price: Price
    attrs: ReserveAttrs
    alerts: list[AlertAttrs]


@dataclass(frozen=True)
class Settlement:
    cost: str  # dollars, frlm_web.money.money_str
    attrs: SettleAttrs
    alerts: list[AlertAttrs]


@dataclass
class _Account:
    reserved: Decimal = ZERO
    settled: Decimal = ZERO

    @property
    def committed(self) -> Decimal:
        return self.reserved + self.settled


def _opt(amount: Decimal | None) -> str | None:
    return None if amount is None else money_str(amount)


class Budget:
    """The spending of one run. Caps hold on committed money (settled plus reserved), so
    sub-queries in flight count before they return, and the 80% alert watches the same
    figure the caps refuse on."""

    def __init__(self, run_id: str, caps: Caps, *, alert_at: float = ALERT_AT) -> None:
        if not 0.0 < alert_at <= 1.0:
            raise ValueError(f"alert_at must be in (0, 1], got {alert_at}")
        self.run_id = run_id
        self.caps = caps
        self.alert_at = alert_at
        self._lock = threading.Lock()
        self._run = _Account()
        self._providers: dict[str, _Account] = {}
        self._subqueries: dict[str, _Account] = {}
        self._open: dict[str, Reservation] = {}
        self._alerted: set[tuple[str, str]] = set()
        self._alerts: list[AlertAttrs] = []
        self._refused = 0
        self._next = 0

    def _caps(self, subquery: str, provider: str) -> list[tuple[Scope, str, Decimal | None]]:
        # The widest first: a refusal by the run's cap means stop, and the caller must hear
        # that rather than a narrower cap's "try elsewhere".
        return [
            ("run", self.run_id, self.caps.run),
            ("provider", provider, self.caps.providers.get(provider)),
            # A root turn (subquery "") is the conductor's own, not a sub-query's.
            ("subquery", subquery, self.caps.subquery if subquery else None),
        ]

    def _account(self, scope: Scope, key: str) -> _Account:
        if scope == "run":
            return self._run
        book = self._providers if scope == "provider" else self._subqueries
        return book.setdefault(key, _Account())

    def _check_alerts(self, subquery: str, provider: str) -> list[AlertAttrs]:
        fired: list[AlertAttrs] = []
        for scope, key, cap in self._caps(subquery, provider):
            if cap is None or (scope, key) in self._alerted:
                continue
            committed = self._account(scope, key).committed
            if committed > 0 and committed >= Decimal(str(self.alert_at)) * cap:
                self._alerted.add((scope, key))
                alert: AlertAttrs = {
                    "scope": scope,
                    "key": key,
                    "cap": money_str(cap),
                    "committed": money_str(committed),
                    "fraction": float(committed / cap) if cap else 1.0,
                    "threshold": self.alert_at,
                }
                fired.append(alert)
                self._alerts.append(alert)
        return fired

    def reserve(
        self,
        *,
        subquery: str,
        provider: str,
        worker_id: str,
        tokens_in: int,
        tokens_out: int,
        price: Price,
    ) -> Reservation:
        """Reserve the estimated cost of one dispatch (estimated tokens at the worker's price)
        before sending it. Raises BudgetRefused, naming the cap, when it would pass one."""
        if tokens_in < 0 or tokens_out < 0:
            raise ValueError("estimated tokens must be 0 or more")
        amount = estimate_cost(tokens_in, tokens_out, price)
        with self._lock:
            base: ReserveAttrs = {
                "reservation": None,
                "subquery": subquery,
                "provider": provider,
                "worker": worker_id,
                "tokens_in_est": tokens_in,
                "tokens_out_est": tokens_out,
                "price_in": money_str(price.per_1k_in),
                "price_out": money_str(price.per_1k_out),
                "amount": money_str(amount),
                "ok": True,
                "refused_by": None,
                "reason": "",
                "run_committed": money_str(self._run.committed),
                "run_cap": _opt(self.caps.run),
            }
            for scope, key, cap in self._caps(subquery, provider):
                if cap is None:
                    continue
                committed = self._account(scope, key).committed
                if committed + amount > cap:
                    self._refused += 1
                    what = {"run": "the run", "provider": f"provider {key}"}.get(
                        scope, f"sub-query {key}"
                    )
                    base["ok"] = False
                    base["refused_by"] = scope
                    base["reason"] = (
                        f"budget cap of {what} reached: ${committed:.6f} of ${cap:.6f} "
                        f"committed, this dispatch needs ${amount:.6f} more; not dispatched"
                    )
                    raise BudgetRefused(base, scope, key, cap)
            self._next += 1
            rid = f"r{self._next}"
            for scope, key, _cap in self._caps(subquery, provider):
                self._account(scope, key).reserved += amount
            base["reservation"] = rid
            base["run_committed"] = money_str(self._run.committed)
            alerts = self._check_alerts(subquery, provider)
            reservation = Reservation(
                id=rid,
                subquery=subquery,
                provider=provider,
                worker_id=worker_id,
                amount=amount,
                price=price,
                attrs=base,
                alerts=alerts,
            )
            self._open[rid] = reservation
            return reservation

    def settle(
        self,
        reservation_id: str,
        *,
        tokens_in: int,
        tokens_out: int,
        cost: Decimal | None = None,
    ) -> Settlement:
        """Replace a reservation by what was spent: `cost` when the caller knows it, else
        the tokens at the reserved price. A worker's reply is paid at most what its caps
        have left (Settlement.cost says what; the attrs' `claimed` what it asked): each
        dispatch reserves an estimate, and a review's worker that wrote long replies with
        the most tokens its text could hold settled each at 62 times its reservation, a
        $0.05 run paying $0.157. A root turn's cost is the conductor's own model call: it
        may pass a cap (the money is gone), and the next reservation is then refused."""
        with self._lock:
            reservation = self._take(reservation_id)
            actual = (
                money(cost, what="a settled cost")
                if cost is not None
                else cost_at(
                    reservation.price.per_1k_in,
                    reservation.price.per_1k_out,
                    tokens_in,
                    tokens_out,
                )
            )
            paid = actual
            if reservation.subquery:
                for scope, key, cap in self._caps(reservation.subquery, reservation.provider):
                    if cap is not None:
                        paid = min(paid, max(ZERO, cap - self._account(scope, key).settled))
            settlement = self._close(reservation, tokens_in, tokens_out, paid, released=False)
            if paid < actual:
                settlement.attrs["claimed"] = money_str(actual)
            return settlement

    def release(self, reservation_id: str) -> Settlement:
        """Give a reservation back unspent: its sub-query was never sent, or was cancelled
        before its worker spent anything."""
        with self._lock:
            return self._close(self._take(reservation_id), 0, 0, ZERO, released=True)

    def _take(self, reservation_id: str) -> Reservation:
        reservation = self._open.pop(reservation_id, None)
        if reservation is None:
            raise ValueError(
                f"no open reservation {reservation_id!r}: it was never made or is already "
                "settled or released"
            )
        return reservation

    def _close(
        self,
        reservation: Reservation,
        tokens_in: int,
        tokens_out: int,
        cost: Decimal,
        released: bool,
    ) -> Settlement:
        for scope, key, _cap in self._caps(reservation.subquery, reservation.provider):
            account = self._account(scope, key)
            account.reserved -= reservation.amount
            account.settled += cost
        attrs: SettleAttrs = {
            "reservation": reservation.id,
            "subquery": reservation.subquery,
            "provider": reservation.provider,
            "worker": reservation.worker_id,
            "reserved": money_str(reservation.amount),
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost": money_str(cost),
            "released": released,
            "run_settled": money_str(self._run.settled),
            "run_committed": money_str(self._run.committed),
            "run_cap": _opt(self.caps.run),
        }
        alerts = self._check_alerts(reservation.subquery, reservation.provider)
        return Settlement(cost=cost, attrs=attrs, alerts=alerts)

    def _figures(self, scope: Scope, key: str, cap: Decimal | None, acc: _Account) -> CapFigures:
        committed = acc.committed
        return {
            "scope": scope,
            "key": key,
            "cap": _opt(cap),
            "reserved": money_str(acc.reserved),
            "settled": money_str(acc.settled),
            "committed": money_str(committed),
            "fraction": (float(committed / cap) if cap else None),
        }

    def fill(self, *, top: int = 10) -> BudgetFill:
        """The figures for the fill view: the run, each provider, and the `top` sub-queries
        with the most committed."""
        with self._lock:
            providers = [
                self._figures("provider", name, self.caps.providers.get(name), acc)
                for name, acc in sorted(self._providers.items())
            ]
            busiest = sorted(
                ((k, a) for k, a in self._subqueries.items() if k), key=lambda kv: -kv[1].committed
            )[:top]
            return {
                "run": self._figures("run", self.run_id, self.caps.run, self._run),
                "providers": providers,
                "subqueries": [
                    self._figures("subquery", name, self.caps.subquery, acc)
                    for name, acc in busiest
                ],
                "refused": self._refused,
                "alerts": list(self._alerts),
            }
