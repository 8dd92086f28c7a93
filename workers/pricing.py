"""Model prices in US dollars per 1,000 tokens (input, output), as exact decimals
(frlm_web.money), from three sources, first match wins:

1. FRLM_PRICES: the operator's own prices (negotiated rates, local models, models no
   list knows). Inline JSON or the path of a JSON file, an object of
   model -> [in, out] or {"in": ..., "out": ...}, dollars per 1,000 tokens, numbers or
   decimal strings: `{"my-llama": ["0.0001", "0.0002"], "gpt-4o": {"in": 0.002, "out": 0.008}}`.
2. genai-prices (pydantic's maintained list of providers' prices, a dependency; its data
   ships in the package, nothing is fetched at run time): any model it recognises.
3. The table below, dated TABLE_DATE: the simulated models' nominal prices (so budgets and
   receipts are exercised; they cost nothing real) and the models FRLM's docs name, for an
   installation without genai-prices.

A model none of them knows has no price: its calls cost 0 unless its worker announces a
price (Worker.price_in / price_out), and `price_source` says so."""

from __future__ import annotations

import functools
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

from frlm_web.money import cost_at, money

TABLE_DATE = "2025-08-07"
_TABLE: dict[str, tuple[str, str]] = {
    "frlm-sim-root": ("0.0025", "0.01"),
    "frlm-sim-worker": ("0.00015", "0.0006"),
    "gpt-4o": ("0.0025", "0.01"),
    "gpt-4o-mini": ("0.00015", "0.0006"),
    "gpt-4.1": ("0.002", "0.008"),
    "gpt-4.1-mini": ("0.0004", "0.0016"),
    "gpt-5": ("0.00125", "0.01"),
    "gpt-5-mini": ("0.00025", "0.002"),
}
# Models whose table price wins over genai-prices: FRLM's own, which no list knows.
_OWN = ("frlm-sim-root", "frlm-sim-worker")


class ModelPrice(NamedTuple):
    per_1k_in: Decimal
    per_1k_out: Decimal
    source: str  # "FRLM_PRICES", "genai-prices 0.2.3", "FRLM's table of 2025-08-07"


def _pair(model: str, value: object) -> tuple[Decimal, Decimal]:
    what = f"FRLM_PRICES[{model!r}]"
    if isinstance(value, dict) and set(value) == {"in", "out"}:
        value = [value["in"], value["out"]]
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(
            f'{what} must be [in, out] or {{"in": ..., "out": ...}} dollars per 1,000 tokens, '
            f"not {value!r}"
        )
    return money(value[0], what=f"{what} in"), money(value[1], what=f"{what} out")


@functools.cache
def overrides() -> dict[str, tuple[Decimal, Decimal]]:
    """FRLM_PRICES, parsed: ValueError with a one-line reason when it is malformed."""
    raw = os.environ.get("FRLM_PRICES", "").strip()
    if not raw:
        return {}
    text = raw
    if not raw.startswith(("{", "[")):
        try:
            text = Path(raw).read_text()
        except OSError as exc:
            raise ValueError(
                f"FRLM_PRICES is neither inline JSON nor a readable file: {raw!r} ({exc.strerror})"
            ) from None
    try:
        table = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise ValueError(f"FRLM_PRICES is not valid JSON: {exc}") from None
    if not isinstance(table, dict):
        raise ValueError('FRLM_PRICES must be a JSON object such as {"model": ["0.001", "0.002"]}')
    return {str(model): _pair(model, pair) for model, pair in table.items()}


@functools.cache
def _listed(model: str) -> ModelPrice | None:
    try:
        import genai_prices
    except ImportError:
        return None
    try:
        one_k_in = genai_prices.calc_price(genai_prices.Usage(input_tokens=1000), model)
        one_k_out = genai_prices.calc_price(genai_prices.Usage(output_tokens=1000), model)
    except LookupError:
        return None
    return ModelPrice(
        Decimal(one_k_in.input_price),
        Decimal(one_k_out.output_price),
        f"genai-prices {genai_prices.__version__}",
    )


def model_price(model: str) -> ModelPrice | None:
    """The price of a model, and where it came from; None when no source knows it."""
    own = overrides().get(model)
    if own is not None:
        return ModelPrice(own[0], own[1], "FRLM_PRICES")
    listed = None if model in _OWN else _listed(model)
    if listed is not None:
        return listed
    if model in _TABLE:
        price_in, price_out = _TABLE[model]
        return ModelPrice(Decimal(price_in), Decimal(price_out), f"FRLM's table of {TABLE_DATE}")
    return None


def payee_price(price_in: Decimal, price_out: Decimal, model: str) -> ModelPrice | None:
    """What a worker's reply to a job for `model` is paid at: the worker's own price when it
    announced one, else the model's list price; None when neither is known. The one rule
    the run's accounts pay by and a worker's page shows."""
    if price_in or price_out:
        return ModelPrice(price_in, price_out, "its own")
    return model_price(model)


def price_source(model: str) -> str:
    price = model_price(model)
    return price.source if price else "no price known (set FRLM_PRICES)"


def cost_of(model: str, tokens_in: int, tokens_out: int) -> Decimal | None:
    """Dollars for one call, or None when the model's price is not known."""
    price = model_price(model)
    if price is None:
        return None
    return cost_at(price.per_1k_in, price.per_1k_out, tokens_in, tokens_out)
