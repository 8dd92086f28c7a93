"""The host's side of the cell protocol: one JSON object per line on the REPL's two control
pipes (child.py lists the messages), and the calls the REPL may make back to the host."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from frlm_web import jsontext

REPL_CALLS = frozenset(
    {"llm_query", "llm_query_batched", "rlm_query", "select_fragments", "objective_verdicts"}
)

# Mirrors child.MAX_MESSAGE_BYTES; bounds what a misbehaving REPL can make the host buffer.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

Handler = Callable[[str, dict[str, Any]], Any]


class SandboxCallError(Exception):
    """Raised by a host handler: the message becomes a RuntimeError inside the REPL code."""


class ChildDied(Exception):
    """The REPL closed its control pipe: it exited or was killed."""


class ProtocolError(Exception):
    """The REPL sent something that is not a protocol message."""


def encode(message: dict[str, Any]) -> bytes:
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One line from the REPL as a message; ProtocolError if it is not a JSON object."""
    try:
        message = jsontext.loads(line.decode("utf-8", "surrogatepass"))
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {line[:80]!r}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"not a JSON object: {line[:80]!r}")
    return message
