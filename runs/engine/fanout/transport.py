"""Every edge of a fanout with Celery and Redis: jobs pushed onto the workers' queues as Celery
messages (workers.wire), replies read from the run's result stream, cancelled jobs revoked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings

from frlm_web.celery import app
from runs.engine.fanout.state import Flight
from runs.engine.policy import Policy
from workers import wire
from workers.jobs import Job, Result, cancelled_key, decode_result, results_stream

# Jobs published per pipelined round trip: the first wave leaves before the batch is built.
DISPATCH_FLUSH = 8
# While work waits to be sent, a reply is not waited for: every worker has a job queued
# behind each running one. Replies then come in clumps (a wave of alike sub-queries ends
# together), and handling them one read at a time costs a whole pass (deadlines, hedging,
# a plan, a publish) per read, on the CPU the workers need at that very moment to start
# their next jobs. So the first reply of a clump waits this long for the rest of it.
GATHER_S = 0.02
RESULTS_KEEP_S = 600  # a run's result stream, after its end (Transport.retire)


class Transport:
    """One run's jobs out and replies in."""

    def __init__(self, *, run_id: str, client: redis.Redis, policy: Policy) -> None:
        self.run_id = run_id
        self.client = client
        self.policy = policy
        self.stream = results_stream(run_id)
        self.revoked: set[str] = set()  # the attempts it cancelled (sq ids)
        self.last_id = "0-0"
        self.reply_to = app.thread_oid  # as Celery's publish names this process's thread
        self.sender = wire.origin()

    def publish(self, ready: list[tuple[Flight, Job]]) -> None:
        """Push the jobs onto their queues as Celery messages (workers.wire), pipelined
        DISPATCH_FLUSH at a time; those for one trusted broker worker go in bundles of up to
        policy.bundle_max (by default FRLM_BUNDLE_MAX), one message each."""
        messages = bundles(ready, self.policy.bundle_max or settings.FRLM_BUNDLE_MAX)
        ids = wire.push(
            self.client,
            [
                (
                    group[0][0].queue,
                    group[0][1] if len(group) == 1 else [job for _f, job in group],
                    f"[{self.run_id} sub-queries {' '.join(f.sq_id for f, _j in group)}]",
                )
                for group in messages
            ],
            expires_s=self.policy.subquery_timeout_s,
            reply_to=self.reply_to,
            sender=self.sender,
            per_trip=DISPATCH_FLUSH,
        )
        for group, task_id in zip(messages, ids, strict=True):
            for flight, _job in group:
                flight.task_id = task_id
                flight.bundled = len(group) > 1

    def read(self, block_ms: int, *, gather: bool) -> list[Any]:
        """The stream's entries since the last one handled, waiting up to `block_ms` for the
        first; with `gather` (work waits to be sent), the rest of its clump too (GATHER_S)."""
        reply = self.client.xread({self.stream: self.last_id}, count=1000, block=block_ms)
        if reply and gather and GATHER_S:
            time.sleep(GATHER_S)
            after = reply[0][1][-1][0]
            more = self.client.xread({self.stream: after}, count=1000)
            if more:
                reply[0][1].extend(more[0][1])
        return reply or []

    def results(self, reply: list[Any]) -> Iterator[Result]:
        """The results a read brought, each marked handled as it is taken, with `at`: when
        it reached the stream, on this process's clock. A read brings a clump (a worker's
        "started" and its reply together, on a busy machine); taking each at the read's own
        time measured some workers at a few milliseconds and made them look ten times
        faster than the rest (issue 23). Each entry is backdated by its age relative to the
        newest one, from the stream's ids: differences of Redis's clock only, so no skew."""
        now = time.time()
        newest = max((_stream_ms(entry_id) for _, es in reply for entry_id, _f in es), default=0)
        for _, entries in reply:
            for entry_id, fields in entries:
                self.last_id = entry_id
                result = decode_result(fields)
                result["at"] = now - max(0, newest - _stream_ms(entry_id)) / 1000
                yield result

    def retire(self) -> None:
        """At the run's end its result stream is read no more: kept RESULTS_KEEP_S (a late
        reply, a debugging look), then gone. Every run left its stream for good, and late
        writes (a worker's results, a gateway's returns) only added to it."""
        self.client.expire(self.stream, RESULTS_KEEP_S)

    def revoke(self, gone: list[Flight]) -> None:
        """Workers skip cancelled jobs they have not started; Celery drops queued ones."""
        if not gone:
            return
        self.revoked.update(f.sq_id for f in gone)
        self.client.sadd(cancelled_key(self.run_id), *[f.sq_id for f in gone])
        self.client.expire(cancelled_key(self.run_id), 86_400)
        # A bundle's task id is its other jobs' too: its worker finds this one in the set.
        ids = [f.task_id for f in gone if f.task_id and not f.bundled]
        if ids:
            app.control.revoke(ids)  # a broadcast to every worker: not for nothing


def bundles(ready: list[tuple[Flight, Job]], most: int) -> list[list[tuple[Flight, Job]]]:
    """The jobs as messages, in the order of each message's first job: a trusted broker
    worker's go together, up to `most` a message; any other (a venue's shared queue, a
    gateway worker's, whose gateway reads one job a message, an untrusted worker's, which
    holds no more than it runs) alone."""
    messages: list[list[tuple[Flight, Job]]] = []
    open_: dict[str, list[tuple[Flight, Job]]] = {}
    for flight, job in ready:
        group = open_.get(flight.queue) if flight.may_bundle and most > 1 else None
        if group is None or len(group) >= most:
            group = [(flight, job)]
            messages.append(group)
            if flight.may_bundle:
                open_[flight.queue] = group
        else:
            group.append((flight, job))
    return messages


def _stream_ms(entry_id: bytes | str) -> int:
    """The milliseconds of a stream entry id ("1700000000000-0")."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])
