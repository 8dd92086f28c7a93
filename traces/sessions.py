"""Which run sockets a session opened, and closing them when it signs out. Light on
purpose: it is connected at start-up (traces/apps.py) by every process, commands included,
so Channels loads only when somebody signs out."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

log = logging.getLogger(__name__)


def session_group(session_key: str) -> str:
    """The group of the sockets one session opened (a hash: the key itself is a secret)."""
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:32]


def close_sessions_sockets(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """user_logged_out: the run sockets this session opened are closed (4401), not left
    streaming the runs to a browser that signed out. A channel layer that cannot be reached
    does not stop the sign-out: the sockets find the session gone within SESSION_CHECK_S."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    key = getattr(getattr(request, "session", None), "session_key", None)
    if not key:
        return
    try:
        async_to_sync(get_channel_layer().group_send)(session_group(key), {"type": "session.ended"})
    except Exception as exc:  # noqa: BLE001 - sign-out goes on; the periodic check closes them
        log.warning("sign-out: could not tell this session's run sockets: %s", exc)
