"""The events stream as the recorder reads it: its consumer group, entry ids, and trimming
what every reader of the stream is done with."""

from __future__ import annotations

from typing import Any

import redis

from traces.emitter import EVENTS_STREAM

GROUP = "recorder"
LIVE_GROUP = "live"  # the live forwarder's group (traces.forwarder)
LIVE_HEARTBEAT_KEY = "frlm:forwarder:alive"
LIVE_LAG_MAX = 1_000_000  # entries a forwarder may be behind before it holds nothing back


def ensure_group(client: redis.Redis) -> None:
    try:
        client.xgroup_create(EVENTS_STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def trim(client: redis.Redis) -> None:
    """Delete the stream's entries that the recorder has acknowledged and the live
    forwarder (traces.forwarder) has read. A forwarder that is not running (no
    heartbeat) or is LIVE_LAG_MAX entries behind holds nothing back: pages fill a gap
    from the store."""
    floors: dict[str, tuple[int, int]] = {}
    live_lag: int | None = None
    for group in client.xinfo_groups(EVENTS_STREAM):
        name = _text(group["name"])
        if name not in (GROUP, LIVE_GROUP):
            continue
        floors[name] = _after(_text(group["last-delivered-id"]))
        if name == LIVE_GROUP:
            live_lag = group.get("lag")
        if name == GROUP and group["pending"]:
            summary = client.xpending(EVENTS_STREAM, GROUP)
            floors[name] = min(floors[name], _parse_id(_text(summary["min"])))
    if GROUP not in floors:
        return
    floor = floors[GROUP]
    if (
        LIVE_GROUP in floors
        and (live_lag is None or live_lag < LIVE_LAG_MAX)
        and client.exists(LIVE_HEARTBEAT_KEY)
    ):
        floor = min(floor, floors[LIVE_GROUP])
    if floor > (0, 1):
        client.xtrim(EVENTS_STREAM, minid=f"{floor[0]}-{floor[1]}", approximate=False)


def _id_text(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _after(entry_id: str) -> tuple[int, int]:
    ms, seq = _parse_id(entry_id)
    return ms, seq + 1
