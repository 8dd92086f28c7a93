"""What travels over the gateway's WebSocket, one JSON object a message, `type` first.

server -> worker: challenge {nonce, version}, welcome {worker_id, venue, heartbeat_s, slots,
    buffer (version 3)}, job {job, with the fragments' text and the id of the Execute span
    the server opened}, jobs {jobs: [job, ...]} (version 2), refused {results: [{sq_id,
    error}], fix} (version 2), cancel {jobs: [{run_id, sq_id}]} (version 3), ping {t},
    error {error, fix, retry_after (seconds, when waiting and connecting again may help:
    its address is throttled)} (then the server closes).
worker -> server: hello {worker_id, nonce, sig, slots, version}, done {sq_id, result,
    events: the Execute span's end and Env.LoadFragment instants}, results {results:
    [{sq_id, result, events} or {sq_id, run_id, started: true} (version 3), ...]}
    (version 2), returned {jobs: [{run_id, sq_id}]} (version 4), beat {figures}, pong {t}.

Version 2 batches: jobs popped together go in one `jobs` message, and results that finish
together in one `results` message, so the server spends one WebSocket message, one JSON
decode and one Redis round trip on a batch, not on each job. Each result in a batch is
still its own, signed by the worker, stamped by the server and checked by the conductor
one by one; a result the server cannot relay (a job the worker does not hold, a malformed
result or event) loses only itself, and the server says which and why in `refused`.
Either side speaks version 2 only to a peer that said it speaks it (the challenge's
`version`, the hello's): an older worker gets one `job` a message, an older server one
`done` a message.

Version 3 adds a work buffer: a worker holds up to `buffer` jobs beyond its slots (its
welcome says how many), so a slot that frees starts the next job at once instead of a
round trip later. The server marks a job it hands over with every slot busy `queued: true`
and tells the conductor so (status `queued`: the worker holds it, it has not started);
the worker says when it starts one (a `started` item, in the `results` message that
carries the result of the job before it in that slot), and only then does the server
open its Execute span and tell the conductor it started, so hedging and the trace count
its run time, not its wait. A queued job the conductor cancels meanwhile (its hedge's twin
answered first, or the batch was cut) is taken back: the server drops it and says so
(`cancel`), and the worker skips it when its turn comes. A worker of version 2 gets no
buffer.

Version 4 lets a worker give jobs back. A session can drop with jobs unanswered: the path
cut, or the web server killed and started again before the worker's presence lapsed. The
server the worker reaches next never gave it those jobs and refuses their results as not
held, and the conductor, seeing the worker present all along, would wait out each job's
sub-query timeout. So the first message of the worker's next session, to a server of
version 4, is `returned`: every job of the dropped session it has sent no result for on
that session (at most MAX_RESULTS a session). The server tells each job's run (status
`returned`, the worker stamped here) where the run's result stream exists, and the
conductor tries a job again at once when its assignee returned it.

Version 5 makes a return provable. Each job the server gives carries `grant`, a MAC of the
worker's id, the run and the job under the server's secret (every web process of a
deployment shares it, so a server started again checks what the last one gave); a
returned item names it, and one without a grant for this worker is ignored. A version 4
return named any job of any run whose result stream was there: a worker never given a job
grew any run's stream without end, and on a shared queue one worker gave back another's
jobs (a review). Returns go only to a server of version 5.

WebSocket rather than HTTP long-poll: jobs reach a worker the moment they are queued, its
results and heartbeats ride the same connection, and the server knows the instant the
connection drops, which is what lets the conductor re-dispatch that worker's jobs at once.
"""

from __future__ import annotations

import json
from typing import Any

from frlm_web import jsontext

VERSION = 5
BATCH_VERSION = 2  # the first version with `jobs`, `results` and `refused`
BUFFER_VERSION = 3  # the first with a work buffer: `queued` jobs, `started` items
RETURN_VERSION = 5  # the first that takes `returned` (each job's `grant` named: version 5)
PATH = "/ws/workers/gateway"
# A job carries its fragments' text (at most workers.fragments.MAX_FRAGMENT_BYTES) and a
# result a model's reply: both directions allow that much and no more.
MAX_MESSAGE_BYTES = 40 * 1024 * 1024
# Span events a worker may report, and how many with one message.
WORKER_EVENTS = frozenset({"SubQuery.Execute", "Env.LoadFragment"})
MAX_EVENTS = 64
# Results one `results` message may hold (a worker's slots are at most a few dozen).
MAX_RESULTS = 256


class ProtocolError(ValueError):
    """A message that breaks the protocol; the message says what is wrong."""


def hello_claim(worker_id: str, nonce: str) -> dict[str, str]:
    """What a worker signs to prove it holds its registered key: the server's fresh nonce,
    bound to this purpose and this worker."""
    return {"purpose": "frlm-gateway-hello", "worker_id": worker_id, "nonce": nonce}


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), default=str)


def batches(parts: list[str], head: str, limit: int = MAX_MESSAGE_BYTES) -> list[str]:
    """Messages `{<head>[<part>,...]}` of JSON texts already encoded, each at most `limit`
    bytes (a part larger than that alone goes alone): each job's or result's text is
    encoded once, not again inside its batch. `head` opens the object up to the list's
    bracket, e.g. '"type":"jobs","jobs":'."""
    messages: list[str] = []
    batch: list[str] = []
    size = len(head) + 4
    for part in parts:
        if batch and size + len(part) + 1 > limit:
            messages.append("{" + head + "[" + ",".join(batch) + "]}")
            batch, size = [], len(head) + 4
        batch.append(part)
        size += len(part) + 1
    if batch:
        messages.append("{" + head + "[" + ",".join(batch) + "]}")
    return messages


def speaks_batches(version: Any) -> bool:
    """Whether a peer that announced `version` takes `jobs`, `results` and `refused`."""
    return isinstance(version, int) and not isinstance(version, bool) and version >= BATCH_VERSION


def speaks_buffer(version: Any) -> bool:
    """Whether a peer that announced `version` holds queued jobs and says when it starts
    them."""
    return speaks_batches(version) and version >= BUFFER_VERSION


def takes_returns(version: Any) -> bool:
    """Whether a server that announced `version` takes `returned`."""
    return speaks_batches(version) and version >= RETURN_VERSION


def buffer_for(slots: int, share: float) -> int:
    """Jobs a worker of `slots` slots may hold beyond them: `share` of its slots
    (settings.FRLM_GATEWAY_BUFFER, by default half), at least one; none for a share of 0.
    Half is enough for the slots a wave frees together to restart at once
    (bench/federation.py: 1.07-1.08x of ideal with it, 1.09-1.10x without; over a link of
    50 ms round trip, 1.13x against 1.38x); no more, so that little waits on a worker that
    turns out slow (hedging sees it waiting) and little is sent again when one is lost."""
    return max(1, int(slots * share)) if share > 0 else 0


def decode(text: str | bytes | None) -> dict[str, Any]:
    if text is None:
        raise ProtocolError("send JSON text messages, not binary")
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a message may hold at most {MAX_MESSAGE_BYTES:,} bytes")
    try:
        message = jsontext.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"a message is not valid JSON: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError('a message must be a JSON object with a "type"')
    return message
