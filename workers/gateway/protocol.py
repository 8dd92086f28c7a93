"""What travels over the gateway's WebSocket, one JSON object a message, `type` first.

server -> worker: challenge {nonce}, welcome {worker_id, venue, heartbeat_s}, job {job, with
    the fragments' text and the id of the Execute span the server opened}, ping {t},
    error {error, fix} (then the server closes).
worker -> server: hello {worker_id, nonce, sig, slots}, done {sq_id, result, events: the
    Execute span's end and Env.LoadFragment instants}, beat {figures}, pong {t}.

WebSocket rather than HTTP long-poll: jobs reach a worker the moment they are queued, its
results and heartbeats ride the same connection, and the server knows the instant the
connection drops, which is what lets the conductor re-dispatch that worker's jobs at once.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from workers.jobs import Job

VERSION = 1
PATH = "/ws/workers/gateway"
# A job carries its fragments' text (at most workers.fragments.MAX_FRAGMENT_BYTES) and a
# result a model's reply: both directions allow that much and no more.
MAX_MESSAGE_BYTES = 40 * 1024 * 1024
# Span events a worker may report, and how many with one message.
WORKER_EVENTS = frozenset({"SubQuery.Execute", "Env.LoadFragment"})
MAX_EVENTS = 64


class ProtocolError(ValueError):
    """A message that breaks the protocol; the message says what is wrong."""


def hello_claim(worker_id: str, nonce: str) -> dict[str, str]:
    """What a worker signs to prove it holds its registered key: the server's fresh nonce,
    bound to this purpose and this worker."""
    return {"purpose": "frlm-gateway-hello", "worker_id": worker_id, "nonce": nonce}


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), default=str)


def decode(text: str | bytes | None) -> dict[str, Any]:
    if text is None:
        raise ProtocolError("send JSON text messages, not binary")
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a message may hold at most {MAX_MESSAGE_BYTES:,} bytes")
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"a message is not valid JSON: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError('a message must be a JSON object with a "type"')
    return message


def celery_job(raw: bytes) -> tuple[str, Job]:
    """The task name and sub-query job in a Celery message as kombu's Redis transport
    keeps it on a queue's list: a JSON envelope whose body is the base64 of the task's
    [args, kwargs, embed] (Celery's message protocol 2)."""
    envelope = json.loads(raw)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = json.loads(body)
    return str(envelope.get("headers", {}).get("task", "")), args[0]
