"""JSON on the paths every sub-query takes: span events as they are written, job messages as
a worker reads them.

The standard library's encoder took 8 µs for a span event of under a kilobyte; a sub-query
makes six, and the conductor writes most of them (json was 13% of its CPU at
1 ms model latency, issue 18's profile). orjson writes the same JSON in under 1 µs.
Its text differs only where JSON allows: no spaces, non-ASCII as UTF-8 rather than
`\\u` escapes, the shortest spelling of a float (1e-5 rather than 1e-05), and NaN or
infinity as null (the standard library wrote `NaN`, which is not JSON: DuckDB's parser and
a page's JSON.parse refuse it). What orjson refuses (an integer past 64 bits, a dict key
that is not a plain type) goes through the standard library as before.

Not for what is signed or hashed (`workers.keys.canonical`): a signature is over one
exact spelling, which must not change with the library."""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS
_slow = json.JSONEncoder(separators=(",", ":"), default=str).encode


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes (what Redis and a file take, so it is never decoded only
    to be encoded again); what JSON cannot hold becomes its str() (a Decimal, a Path)."""
    try:
        return orjson.dumps(obj, default=str, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: an int past 64 bits, a key of odd type
        return _slow(obj).encode("utf-8")


def loads(text: str | bytes) -> Any:
    """json.loads, faster; text orjson refuses (NaN, nesting past its limit of 1,024
    levels) is read by json.loads, so whatever read before still reads."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
