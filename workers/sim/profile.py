"""The simulated model's latency and failure profile, and the per-request decision drawn
from it.

Every decision comes from an RNG seeded by the request itself (profile seed, attempt,
model, messages), so the same request always gets the same latency, the same failure and
the same lie: a recorded run replays exactly, and a test can assert what it will see.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

from workers.sim import ChatMessage

# A lognormal with a large sigma has a long tail; no simulated reply should hold a
# connection longer than any sane client timeout.
MAX_DELAY_S = 600.0


class SimFields(TypedDict, total=False):
    """The `sim` object of a request body (`extra_body={"sim": {...}}`); all optional."""

    latency_ms: float  # median latency
    spread: float  # sigma of the lognormal around the median; 0 gives exactly latency_ms
    straggler_rate: float  # probability that a request takes straggler_factor times longer
    straggler_factor: float
    failure_rate: float  # probability of an HTTP 500
    lie_rate: float  # probability that a worker reply is plausible but wrong
    collude: float  # probability that a lie is the colluders' shared one (same prompt, same lie)
    seed: int
    attempt: int  # mixed into the RNG seed so that a retry is an independent draw


class ProfileError(ValueError):
    """A `sim` field has the wrong type or is out of range."""


@dataclass(frozen=True)
class Profile:
    latency_ms: float = 0.0
    spread: float = 0.0
    straggler_rate: float = 0.0
    straggler_factor: float = 10.0
    failure_rate: float = 0.0
    lie_rate: float = 0.0
    collude: float = 0.0
    seed: int = 0
    attempt: int = 0


@dataclass(frozen=True)
class Decision:
    delay_s: float
    straggler: bool
    fail: bool
    lie: bool
    lie_seed: int  # seeds the RNG that makes up a lie, so the lie is reproducible too


_RATES = ("straggler_rate", "failure_rate", "lie_rate", "collude")
_NON_NEGATIVE = ("latency_ms", "spread")
_INTEGERS = ("seed", "attempt")


def parse_profile(fields: Mapping[str, object], base: Profile | None = None) -> Profile:
    """Overlay `fields` (a request's `sim` object or the command-line flags) on `base`."""
    base = base or Profile()
    known = set(Profile.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ProfileError(
            f"unknown sim field {unknown[0]!r}; known fields: {', '.join(sorted(known))}"
        )
    values: dict[str, float | int] = {}
    for name, value in fields.items():
        if value is None:
            continue
        values[name] = _check_field(name, value)
    return replace(base, **values)


def _check_field(name: str, value: object) -> float | int:
    # bool is an int to Python but never what a caller meant by a rate or a seed.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"sim field {name!r} must be a number, not {value!r}")
    if name in _INTEGERS:
        if not isinstance(value, int):
            raise ProfileError(f"sim field {name!r} must be an integer, not {value!r}")
        return value
    number = float(value)
    if not math.isfinite(number):
        raise ProfileError(f"sim field {name!r} must be finite, not {value!r}")
    if name in _RATES and not 0.0 <= number <= 1.0:
        raise ProfileError(f"sim field {name!r} is a probability: between 0 and 1, not {value!r}")
    if name in _NON_NEGATIVE and number < 0:
        raise ProfileError(f"sim field {name!r} must not be negative, not {value!r}")
    if name == "straggler_factor" and number < 1:
        raise ProfileError(f"sim field 'straggler_factor' must be at least 1, not {value!r}")
    return number


def request_rng(profile: Profile, model: str, messages: Sequence[ChatMessage]) -> random.Random:
    """An RNG that depends only on what the request says."""
    payload = json.dumps(
        [profile.seed, profile.attempt, model, [[m["role"], m["content"]] for m in messages]],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(payload.encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def decide(profile: Profile, model: str, messages: Sequence[ChatMessage]) -> Decision:
    """Draw this request's latency, straggling, failure and lie."""
    rng = request_rng(profile, model, messages)
    # Draw every variable, always in this order, whatever the rates: raising one rate
    # then only adds events of that kind and leaves the other draws where they were.
    fail_draw = rng.random()
    straggler_draw = rng.random()
    spread_draw = rng.gauss(0.0, 1.0)
    lie_draw = rng.random()
    lie_seed = rng.getrandbits(32)
    collude_draw = rng.random()
    if collude_draw < profile.collude:
        # Colluders agree on their lie: it depends on the question alone, not on who lies.
        question = messages[-1]["content"] if messages else ""
        digest = hashlib.sha256(f"collude:{question}".encode("utf-8", "replace")).digest()
        lie_seed = int.from_bytes(digest[:4], "big")

    straggler = straggler_draw < profile.straggler_rate
    delay_ms = profile.latency_ms * math.exp(profile.spread * spread_draw)
    if straggler:
        delay_ms *= profile.straggler_factor
    return Decision(
        delay_s=min(delay_ms / 1000.0, MAX_DELAY_S),
        straggler=straggler,
        fail=fail_draw < profile.failure_rate,
        lie=lie_draw < profile.lie_rate,
        lie_seed=lie_seed,
    )
