"""Money as exact decimals (ARCHITECTURE.md §9): every price, cost, cap and payment is a
`decimal.Decimal` of dollars, never a float, so sums of many small costs stay exact, a cap
filled to the cent is filled and not passed by a rounding error, and nothing is left over
(a float budget printed `"reserved": 5.2e-18` after every reservation was settled).

Decimal rather than integer micro-dollars: a sub-query of a few hundred tokens at
$0.15 per million costs a few hundredths of a micro-dollar, so integer micro-dollars would
round real costs away, and any finer integer unit is a second spelling of the same number
that every reader must convert. Prices arrive as decimal text (genai-prices, FRLM_PRICES,
the worker API), and tokens times a price per 1,000 is exact in Decimal.

Outside the process money is a decimal string ("0.00075", never "7.5E-7"): in JSON
(`frlm_run --json`, Run.accounts, event attrs, receipts) and on the wire between workers
and the conductor. The trace store's `cost` column is the one float: a measurement per
span for charts and export, not the books."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

ZERO = Decimal(0)
THOUSAND = Decimal(1000)


def money(value: Any, *, what: str = "an amount") -> Decimal:
    """`value` as exact dollars: a Decimal, an int, a decimal string, or a float (taken by its
    shortest spelling, so 0.1 is 0.1: old receipts and JSON numbers). ValueError, naming
    `what`, for anything else, for NaN or infinity, and for a negative amount."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of dollars, not {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be a finite number of dollars, not {value!r}")
        value = repr(value)
    try:
        amount = Decimal(value) if isinstance(value, (Decimal, int, str)) else None
    except InvalidOperation:
        amount = None
    if amount is None or not amount.is_finite():
        raise ValueError(f"{what} must be a number of dollars such as 0.0025, not {value!r}")
    if amount < 0:
        raise ValueError(f"{what} must be 0 or more dollars, not {value!r}")
    return amount


def money_str(amount: Decimal | int) -> str:
    """The canonical spelling of an amount: plain digits, no exponent, no trailing zeros
    ("0.00075", "2", "0")."""
    text = format(Decimal(amount).normalize(), "f")
    return "0" if text in ("-0", "") else text


def is_money_str(value: Any) -> bool:
    """Whether `value` is an amount in its canonical spelling (what receipts carry)."""
    if not isinstance(value, str):
        return False
    try:
        return money_str(money(value)) == value
    except ValueError:
        return False


def cost_at(price_in: Decimal, price_out: Decimal, tokens_in: int, tokens_out: int) -> Decimal:
    """Dollars for tokens at a price per 1,000 tokens in and out: exact."""
    return (tokens_in * price_in + tokens_out * price_out) / THOUSAND


def jsonable(value: Any) -> Any:
    """`value` with every Decimal in it spelt as its money string, for json.dumps."""
    if isinstance(value, Decimal):
        return money_str(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
