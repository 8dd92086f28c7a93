"""A cap on what comes back: a model's reply, a run's answer, an event's payload.

A reply far longer than any real model writes (a broken or hostile endpoint, a REPL that
builds a huge FINAL) is cut to FRLM_MAX_REPLY_CHARS and says so in its own last line, so it
is never stored, relayed or printed whole; the caller records how long it was.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULT_LIMIT = 1_000_000
_MARK_ROOM = 200
# The limit, read from the settings once they are configured: every event with a payload
# asks (the settings' lookup was 3% of a conductor's CPU at 1 ms model latency, issue 18's
# profile), and a test's override of the setting clears it.
_limit: int | None = None


def reply_limit() -> int:
    global _limit
    if _limit is not None:
        return _limit
    # Emitters also run in scripts that never configure Django (benches): the default then.
    if not settings.configured:
        return DEFAULT_LIMIT
    _limit = int(getattr(settings, "FRLM_MAX_REPLY_CHARS", DEFAULT_LIMIT))
    return _limit


def _forget(*, setting: str, **_kwargs: Any) -> None:
    global _limit
    if setting == "FRLM_MAX_REPLY_CHARS":
        _limit = None


setting_changed.connect(_forget)


def cut(text: str, limit: int | None = None) -> tuple[str, int]:
    """(``text``, 0) within ``limit`` characters (default FRLM_MAX_REPLY_CHARS); else its
    first ``limit`` characters with a closing line that says so, and its whole length."""
    limit = reply_limit() if limit is None else limit
    # Room for the closing line: a text cut once passes again unchanged.
    if len(text) <= limit + _MARK_ROOM:
        return text, 0
    mark = (
        f"\n[frlm: cut: {len(text):,} characters, the first {limit:,} kept; "
        "FRLM_MAX_REPLY_CHARS sets the limit]"
    )
    return text[:limit] + mark, len(text)
