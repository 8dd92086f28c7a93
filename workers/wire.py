"""A sub-query job on a queue: the Celery message (protocol 2, JSON body, as kombu's Redis
transport keeps it on a queue's list) that carries it, written without Celery by the
conductor and read without Celery by the gateway.

Celery's own publish (apply_async through a kombu producer) spent a third of the
conductor's CPU in a batch (0.5 ms per job: its configuration lookups, the message's
headers built field by field, kombu's serializer registry and its publish wrappers): the
envelope is the same each time but for a few ids and a time, so it is written here in one
JSON encoding and pushed with LPUSH, as kombu does (priority 0, the queue's own list, no
declare). A Celery worker of a trusted venue reads it as one of its own; the gateway reads
it with `job_of`."""

from __future__ import annotations

import base64
import os
import socket
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from frlm_web import fastjson
from workers.jobs import Job

TASK = "workers.subquery_execute"  # workers.tasks.subquery_execute's registered name
# workers.tasks.subquery_bundle: several jobs for one broker worker in one message, so its
# Celery consumer pays a message's cost (the read, the request, the task's tracing: a third
# of a worker's CPU per job, issue 18's profile) once for all of them.
BUNDLE_TASK = "workers.subquery_bundle"
# Celery's "embed" part of a body: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _encode(obj: Any) -> str:
    """JSON for a message, by orjson (the standard library's encoder was 2% of a conductor's
    CPU at 1 ms model latency): compact, and UTF-8 where kombu would write ASCII escapes,
    which kombu, Celery and the gateway read alike."""
    return fastjson.dumps(obj).decode("utf-8")


# Up to ARGV[1] messages off the lists in KEYS, the first list drained first (the worker's
# own queue before its venue's, as BRPOP orders them), in one round trip: the jobs for a
# worker's free slots, popped by the gateway for its workers and by FRLM's own consumer
# (workers/consumer.py). RPOP with a count needs Redis 6.2. The reply is how many came
# from each list, then the messages (`popped`), so what the gateway popped for a session
# that ended can go back where it was (workers/gateway/pump.py).
POP_LUA = """
local want = tonumber(ARGV[1])
local out = {}
local counts = {}
for i, key in ipairs(KEYS) do
  counts[i] = 0
  if #out < want then
    local got = redis.call('RPOP', key, want - #out)
    if got then
      for _, raw in ipairs(got) do out[#out + 1] = raw end
      counts[i] = #got
    end
  end
end
return {counts, out}
"""


def popped(queues: Sequence[str], reply: list[Any]) -> list[tuple[str, bytes]]:
    """POP_LUA's reply (or the gateway's TAKE_LUA's, workers/gateway/pump.py) as (queue,
    message) pairs, in the order popped."""
    counts, raws = reply
    sources = [queue for queue, n in zip(queues, counts, strict=True) for _ in range(int(n))]
    return list(zip(sources, raws, strict=True))


def origin() -> str:
    """Who sent it, as Celery names a process that is not a worker ("gen<pid>@<host>")."""
    return f"gen{os.getpid()}@{socket.gethostname()}"


def job_message(
    job: Job | list[Job],
    *,
    task_id: str,
    queue: str,
    expires_s: float,
    argsrepr: str,
    reply_to: str,
    sender: str,
    now: datetime | None = None,
) -> str:
    """The message that runs `subquery_execute(job)` on a worker of `queue` (given a list of
    jobs, `subquery_bundle(jobs)`), dropped by the worker once `expires_s` have passed (the
    `expires` header, as apply_async(expires=) writes it)."""
    expires = (now or datetime.now(UTC)) + timedelta(seconds=expires_s)
    task = BUNDLE_TASK if isinstance(job, list) else TASK
    body = fastjson.dumps([[job], {}, _EMBED])
    return _encode(
        {
            "body": base64.b64encode(body).decode("ascii"),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": task,
                "id": task_id,
                "shadow": None,
                "eta": None,
                "expires": expires.isoformat(),
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": task_id,
                "parent_id": None,
                "argsrepr": argsrepr,
                "kwargsrepr": "{}",
                "origin": sender,
                "ignore_result": True,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            },
            "properties": {
                "correlation_id": task_id,
                "reply_to": reply_to,
                "argsrepr": argsrepr,
                "kwargsrepr": "{}",
                "delivery_mode": 2,
                "expiration": str(int(expires_s * 1000)),
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def push(
    client: redis.Redis,
    jobs: list[tuple[str, Job | list[Job], str]],
    *,
    expires_s: float,
    reply_to: str,
    sender: str,
    per_trip: int,
) -> list[str]:
    """Push each (queue, job or bundle of jobs, argsrepr) onto its queue's list as a
    job_message, `per_trip` to a pipelined round trip, so the first of a long list leave
    before the last are written; returns their task ids, in order."""
    now = datetime.now(UTC)
    ids: list[str] = []
    for start in range(0, len(jobs), per_trip):
        pipe = client.pipeline(transaction=False)
        for queue, job, argsrepr in jobs[start : start + per_trip]:
            task_id = str(uuid.uuid4())
            message = job_message(
                job,
                task_id=task_id,
                queue=queue,
                expires_s=expires_s,
                argsrepr=argsrepr,
                reply_to=reply_to,
                sender=sender,
                now=now,
            )
            pipe.lpush(queue, message)
            ids.append(task_id)
        pipe.execute()
    return ids


def job_of(raw: bytes | str) -> tuple[str, Job]:
    """The task name and sub-query job in a message on a queue's list: a JSON envelope whose
    body is the base64 of the task's [args, kwargs, embed] (Celery's message protocol 2),
    whoever wrote it."""
    envelope = fastjson.loads(raw)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = fastjson.loads(body)
    return str(envelope.get("headers", {}).get("task", "")), args[0]


def jobs_of(raw: bytes | str) -> list[Job]:
    """The sub-query jobs in a message on a queue's list: one for `subquery_execute`, several
    for a bundle. ValueError for a message that is not a sub-query task."""
    try:
        task, arg = job_of(raw)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a Celery task: {exc}") from exc
    jobs = arg if task == BUNDLE_TASK else [arg] if task == TASK else None
    if not isinstance(jobs, list) or not all(isinstance(job, dict) for job in jobs):
        raise ValueError(f"{task[:80]} is not a sub-query task")
    return jobs
