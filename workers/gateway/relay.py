"""What the gateway relays of a worker's result: only for a job the worker holds, its result
and span events rebuilt from known fields, with run, venue and worker set by the server.
Plain functions over the jobs a connection holds (workers/gateway/server.py keeps them)."""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import secrets
import time
from typing import Any

from django.utils.crypto import salted_hmac

from traces import caps
from traces.schema import problems
from workers.gateway.protocol import MAX_EVENTS, MAX_RESULTS, WORKER_EVENTS, ProtocolError
from workers.jobs import MAX_COST, MAX_MS, MAX_TOKENS

EVENT_KEYS = ("ms", "bytes", "tokens_in", "tokens_out", "cost", "payload_ref")
# The most each of a worker's figures may be, as decode_result bounds its result's.
EVENT_BOUNDS = {"ms": MAX_MS, "tokens_in": MAX_TOKENS, "tokens_out": MAX_TOKENS, "cost": MAX_COST}
# A worker's event attributes beyond its reply's text (`_payload`, held to the reply cap):
# a review stored 30 MB of them in one span (a 31 MB span tree on disk), cost 1e308 beside.
ATTRS_MAX_BYTES = 16_384
STATUSES = ("ok", "error", "cancelled")


@dataclasses.dataclass
class Held:
    """A job the worker holds: given to it and not yet answered, and its Execute span."""

    run_id: str
    sq_id: str
    submit_span: str
    execute_span: str
    depth: int
    model: str  # the model the job asks for
    queued: bool = False  # in its work buffer, not started yet: its Execute span not open
    timeout_s: float = 0.0  # the job's: held far past it, it is taken back (credit.py)
    seen: float = 0.0  # when the session's watch first saw it held (time.monotonic)

    @property
    def key(self) -> tuple[str, str]:
        return (self.run_id, self.sq_id)


@dataclasses.dataclass
class Relayed:
    """A result fit to relay: the job it answers, the result as the server stamps it, and
    the worker's events of that job."""

    held: Held
    result: dict[str, Any]
    events: list[dict[str, Any]]


class NotHeld(ProtocolError):
    """A result for a job this worker does not hold (any more)."""


def named(item: Any, held: dict[tuple[str, str], Held]) -> Held | None:
    """The held job a worker's result names (by its run and sub-query), if any."""
    if not isinstance(item, dict) or not isinstance(item.get("result"), dict):
        return None
    run_id, sq_id = item["result"].get("run_id"), item.get("sq_id")
    if not isinstance(run_id, str) or not isinstance(sq_id, str):
        return None
    return held.get((run_id, sq_id))


def started(item: Any, held: dict[tuple[str, str], Held]) -> Held | None:
    """The queued job a worker's `started` item {sq_id, run_id, started: true} names, if
    the worker holds it queued; None for anything else (a job not queued, not its own or
    started already), which changes nothing."""
    if not isinstance(item, dict) or item.get("started") is not True:
        return None
    run_id, sq_id = item.get("run_id"), item.get("sq_id")
    if not isinstance(run_id, str) or not isinstance(sq_id, str):
        return None  # a list here was unhashable and took the socket down (a review)
    job = held.get((run_id, sq_id))
    return job if job is not None and job.queued else None


def slots_freed(
    held: dict[tuple[str, str], Held], answered: list[Held], begun: list[Held]
) -> list[Held]:
    """The queued jobs that take the slots these answers free, oldest first, past those the
    worker said it began: a queued job has started, at the latest, when a slot freed for
    it, whatever the worker says. The conductor times a job from its start: a review's
    worker said `started` only with each job's result and was measured at about 0 ms a job
    (0.4 s each), the fastest worker there was to the router."""
    free = sum(1 for job in answered if not job.queued) - len(begun)
    if free <= 0:
        return []
    skip = {job.key for job in (*answered, *begun)}
    taken = [job for job in held.values() if job.queued and job.key not in skip][:free]
    for job in taken:
        job.queued = False
    return taken


def checked(
    item: Any,
    held: dict[tuple[str, str], Held],
    venue: str,
    worker_id: str,
    *,
    seen: set[tuple[str, str]] | None = None,
) -> Relayed:
    """One result {sq_id, result, events} of a job in `held` (and not in `seen`: answered
    earlier in the same message), ready to relay; NotHeld or ProtocolError says why not."""
    job = named(item, held)
    if job is None or (seen is not None and job.key in seen):
        sq_id = item.get("sq_id") if isinstance(item, dict) else None
        raise NotHeld(
            f"this worker holds no job {str(sq_id)[:40]!r} of that run (answered already, "
            "or never given to it)"
        )
    result = item["result"]
    if result.get("status") not in STATUSES:
        raise ProtocolError("a result's status must be ok, error or cancelled")
    events = worker_events(item.get("events"), job, venue, worker_id)
    # The server's word on who, which run and which venue; the worker's signature covers
    # them, so a worker that signed for another identity fails at the conductor.
    stamped = {
        **{k: v for k, v in result.items() if isinstance(v, str | int | float)},
        "run_id": job.run_id,
        "sq_id": job.sq_id,
        "venue": venue,
        "worker_id": worker_id,
    }
    return Relayed(job, stamped, events)


def worker_events(raw: Any, job: Held, venue: str, worker_id: str) -> list[dict[str, Any]]:
    """The worker's span events of this job, rebuilt from known fields only, with the
    run, venue and worker set by the server."""
    raw = raw or []
    if not isinstance(raw, list) or len(raw) > MAX_EVENTS:
        raise ProtocolError(f"events must be a list of at most {MAX_EVENTS}")
    return [_event(item, job, venue, worker_id) for item in raw]


def _attrs(raw: Any, name: str) -> dict[str, Any]:
    """The event's attributes: its reply's text within the reply cap, the rest within
    ATTRS_MAX_BYTES as JSON; else refused, the job tried elsewhere."""
    if not isinstance(raw, dict):
        return {}
    payload = raw.get("_payload")
    if payload is not None and (
        not isinstance(payload, str) or len(payload) > caps.reply_limit() + 1_000
    ):
        raise ProtocolError(f"its {name} event's reply text is over the reply cap")
    rest = {k: v for k, v in raw.items() if k != "_payload"}
    try:
        size = len(json.dumps(rest, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"its {name} event's attributes are not JSON: {exc}") from exc
    if size > ATTRS_MAX_BYTES:
        raise ProtocolError(
            f"its {name} event's attributes are {size:,} bytes; at most {ATTRS_MAX_BYTES:,}"
        )
    return raw


def _event(item: Any, job: Held, venue: str, worker_id: str) -> dict[str, Any]:
    if not isinstance(item, dict) or item.get("name") not in WORKER_EVENTS:
        raise ProtocolError("a worker reports only " + ", ".join(sorted(WORKER_EVENTS)))
    # The worker ends the Execute span the server opened, and hangs its instants under
    # it; nothing else. The ids of what it sends are the server's: an instant that named
    # the Submit span as its own, with phase "end", took that span over in every reader
    # of the trace (a review), and an event id of its choosing could name another event.
    if item["name"] == "SubQuery.Execute":
        if item.get("span_id") != job.execute_span or item.get("phase") != "end":
            raise ProtocolError("a worker only ends the Execute span it was given")
        parent, span_id, phase = job.submit_span, job.execute_span, "end"
    else:
        if item.get("phase", "instant") != "instant":
            raise ProtocolError(f"a worker's {item['name']} is an instant, not a span")
        parent, span_id, phase = job.execute_span, secrets.token_hex(8), "instant"
    if item.get("parent_id") != parent:
        raise ProtocolError(f"a {item['name']} event hangs under the wrong span")
    attrs = _attrs(item.get("attrs"), item["name"])
    event = {
        "run_id": job.run_id,
        "event_id": secrets.token_hex(8),
        "span_id": span_id,
        "parent_id": parent,
        "links": [],
        "name": item["name"],
        "phase": phase,
        "ts": item["ts"] if isinstance(item.get("ts"), int) else time.time_ns(),
        "status": str(item.get("status", "ok"))[:16],
        "venue": venue,
        "worker_id": worker_id,
        "depth": item["depth"] if isinstance(item.get("depth"), int) else 0,
        "attrs": attrs,
    }
    for key in EVENT_KEYS:
        if isinstance(item.get(key), int | float | str) and not isinstance(item[key], bool):
            event[key] = item[key]
            bound = EVENT_BOUNDS.get(key)
            if bound is not None and not (
                isinstance(item[key], int | float) and 0 <= item[key] <= bound
            ):
                raise ProtocolError(
                    f"its {item['name']} event's {key} must be a number from 0 to {bound}"
                )
    wrong = problems({**event, "seq": 1})  # its seq is given as it is appended
    if wrong:
        # Relayed, the recorder would dead-letter it and leave the span open in the trace
        # (a review sent ts 10**30 and ms "abc"): refused here, the job tried elsewhere.
        raise ProtocolError(f"its {item['name']} event does not fit the trace: {wrong[0]}")
    return event


# -- jobs a worker gives back (version 5) --------------------------------------------------
ID_MAX = 64  # characters of a run's or a sub-query attempt's id a worker names
RETURN_FIELDS = ("run_id", "sq_id", "grant")
GRANT_SALT = "frlm.gateway.grant"


def grant_for(worker_id: str, run_id: str, sq_id: str) -> str:
    """What proves a job was given to this worker (protocol version 5): a MAC of the three
    under the deployment's secret, so a server started again checks what the last one
    gave. 128 bits: unguessable, and short on the wire."""
    message = f"{worker_id}\0{run_id}\0{sq_id}"
    return salted_hmac(GRANT_SALT, message, algorithm="sha256").hexdigest()[:32]


def granted_returns(items: Any, worker_id: str, so_far: int) -> tuple[list[tuple[str, str]], int]:
    """The (run, job) of each returned job named with a grant made for this worker, and how
    many named none of theirs (forged, or for another worker). ProtocolError: not a list
    of 1 to MAX_RESULTS jobs in all over a session (`so_far` before), or an item that is
    not {run_id, sq_id, grant}."""
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_RESULTS - so_far:
        raise ProtocolError(
            f"returned must list 1 to {MAX_RESULTS} jobs in all over a session ({so_far} so far)"
        )
    keys: list[tuple[str, str]] = []
    forged = 0
    for item in items:
        fields = [item.get(k) if isinstance(item, dict) else None for k in RETURN_FIELDS]
        if not all(isinstance(v, str) and 0 < len(v) <= ID_MAX for v in fields):
            raise ProtocolError(
                "a returned job is {run_id, sq_id, grant}, each a string of 1 to "
                f"{ID_MAX} characters (the grant as its job came with it)"
            )
        run_id, sq_id, grant = fields
        # As bytes: compare_digest refuses text that is not ASCII (TypeError), and a worker
        # that sent such a grant broke its session's handler (a review).
        expected = grant_for(worker_id, run_id, sq_id).encode()
        if hmac.compare_digest(grant.encode("utf-8", "surrogatepass"), expected):
            keys.append((run_id, sq_id))  # type: ignore[arg-type]
        else:
            forged += 1
    return keys, forged


def new_ids(count: int) -> list[str]:
    """`count` random ids of 16 hex digits, from one read of the system's random source
    (a system call is dear here: one per id was a tenth of a job's hand-off)."""
    pool = os.urandom(8 * count).hex()
    return [pool[i : i + 16] for i in range(0, 16 * count, 16)]
