"""Prices per 1,000 tokens (input, output) in US dollars. FRLM_PRICES (JSON object of
model -> [in, out]) adds or overrides entries. The simulated model's prices are nominal,
so that budgets and receipts are exercised; it costs nothing real."""

from __future__ import annotations

import functools
import json
import os

_DEFAULT: dict[str, tuple[float, float]] = {
    "frlm-sim-root": (0.0025, 0.01),
    "frlm-sim-worker": (0.00015, 0.0006),
    "gpt-4o": (0.0025, 0.01),
    "gpt-4o-mini": (0.00015, 0.0006),
    "gpt-4.1": (0.002, 0.008),
    "gpt-4.1-mini": (0.0004, 0.0016),
    "gpt-5": (0.00125, 0.01),
    "gpt-5-mini": (0.00025, 0.002),
}


@functools.cache
def price_table() -> dict[str, tuple[float, float]]:
    table = dict(_DEFAULT)
    extra = os.environ.get("FRLM_PRICES")
    if extra:
        for model, pair in json.loads(extra).items():
            table[model] = (float(pair[0]), float(pair[1]))
    return table


def cost_of(model: str, tokens_in: int, tokens_out: int) -> float | None:
    """Dollars for one call, or None when the model's price is not known."""
    price = price_table().get(model)
    if price is None:
        return None
    return cost_at(price[0], price[1], tokens_in, tokens_out)


def cost_at(price_in: float, price_out: float, tokens_in: int, tokens_out: int) -> float:
    """Dollars for tokens at a price per 1,000 tokens in and out (a model's or a worker's)."""
    return (tokens_in * price_in + tokens_out * price_out) / 1000.0
