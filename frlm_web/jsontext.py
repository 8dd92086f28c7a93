"""JSON that comes from outside a process (a worker's request or message, a model's answer,
the REPL, an event on the stream, a file a user imports): every way reading it can fail is a
ValueError, so one `except ValueError` refuses it with the caller's own clear error.

json.loads raises JSONDecodeError and UnicodeDecodeError (both ValueErrors) for bad text, but
RecursionError for text nested deeper than its parser recurses: two kilobytes of "[" took
the worker API down with a 500 and the gateway with an internal error (found by a review)."""

from __future__ import annotations

import json
from typing import Any

TOO_DEEP = "the JSON is nested too deeply (the limit is about 1,000 levels)"


def loads(text: str | bytes | bytearray) -> Any:
    """json.loads, raising ValueError (never RecursionError) for whatever it cannot read."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
