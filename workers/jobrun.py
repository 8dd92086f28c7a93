"""What a broker worker does with a job, in three steps; the first and the last are shared by
the jobs that take them together.

1. **open** (`open_jobs`, for the jobs the worker's consumer took off its queues at once):
   skip work nobody wants any more (past its deadline), pick the model endpoint, then in
   one Redis round trip for all of them check the runs' cancelled sets, open each job's
   `SubQuery.Execute` span and tell each conductor who holds its job (`started`);
2. **work** (`Opened.work`, on the job's slot thread): read the fragments the prompt
   names, call the model, build and sign the result;
3. **deliver** (a `Deliver`): the span's end, the fragments it loaded and the signed
   result go to Redis together: at once (`deliver_now`, a Celery task's job), or with the
   other results that finished meanwhile, in one round trip (workers/delivery.py, FRLM's
   own consumer).

At 1 ms model latency a worker spent about a third of its CPU per job on its three round
trips (the pop, the start, the result), and at 200 ms the sixteen slots of a worker that
end together paid them one after another before the last slot's next job could start
(issue 18's profile)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from frlm_web.redis_client import get_redis
from traces.emitter import Emitter, append
from traces.schema import Event
from workers import fragments, venues
from workers.alive import ALIVE_ENV
from workers.backends import ChatResult, ModelError, ModelSpec, achat, chat
from workers.execution import ok_result, reply_fields, served, signed
from workers.jobs import Job, Result, cancelled_key, encode_result, results_stream
from workers.sim.device import on_device

# events (the span's end last), the run's result stream, the signed result
Deliver = Callable[[list[Event], str, Result], None]
# Runs the commands a function queues on a pipeline and returns their replies.
RoundTrip = Callable[[Callable[[Any], None]], list[Any]]
SPAN = "SubQuery.Execute"


def deliver_now(client: redis.Redis) -> Deliver:
    """Each result in a round trip of its own, as it comes."""

    def deliver(events: list[Event], stream: str, result: Result) -> None:
        pipe = client.pipeline(transaction=False)
        append(events, pipe)
        pipe.xadd(stream, encode_result(result))
        pipe.execute()

    return deliver


def round_trip_now(client: redis.Redis) -> RoundTrip:
    """A round trip of its own for each call."""

    def send(fill: Callable[[Any], None]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        fill(pipe)
        return pipe.execute()

    return send


@dataclass(eq=False)
class Opened:
    """A job whose Execute span is open and whose conductor knows this worker holds it."""

    job: Job
    base: Result
    emitter: Emitter
    spec: ModelSpec
    start: Event
    stream: str = field(init=False)

    def __post_init__(self) -> None:
        self.stream = results_stream(self.job["run_id"])

    def work(self, deliver: Deliver) -> bool:
        """Call the model and hand the signed result over; True (it called the model)."""
        loaded: list[Event] = []
        try:
            prompt, loaded = self._load_fragments()
            reply = chat(self.spec, _asking(prompt), **self._options())
        except (fragments.FragmentError, ModelError) as exc:
            return self._failed(deliver, str(exc), loaded)
        return self._replied(deliver, reply, loaded)

    async def awork(self, deliver: Deliver) -> bool:
        """`work` as a task of an asyncio worker (workers/aslots.py)."""
        loaded: list[Event] = []
        try:
            if fragments.carries(self.job["prompt"]):
                # Read and checked off the loop: a fragment of a large context takes
                # milliseconds of file reading and hashing, which the loop's other jobs,
                # each waiting on its reply, would wait out one after another.
                prompt, loaded = await asyncio.to_thread(self._load_fragments)
            else:
                prompt = self.job["prompt"]
            reply = await achat(self.spec, _asking(prompt), **self._options())
        except (fragments.FragmentError, ModelError) as exc:
            return self._failed(deliver, str(exc), loaded)
        return self._replied(deliver, reply, loaded)

    def _options(self) -> dict[str, Any]:
        job = self.job
        return {"timeout": job["timeout_s"], "retries": 1, "recorded": job.get("recorded")}

    def _failed(self, deliver: Deliver, error: str, loaded: list[Event]) -> bool:
        self.fail(deliver, error, loaded)
        return True

    def _replied(self, deliver: Deliver, reply: ChatResult, loaded: list[Event]) -> bool:
        try:
            result = ok_result(self.job, self.base, self.base["worker_id"], reply)
        except ValueError as exc:
            return self._failed(deliver, f"cannot attest: {exc}", loaded)
        self.finish(deliver, result, "ok", loaded, **reply_fields(reply))
        return True

    def _load_fragments(self) -> tuple[str, list[Event]]:
        """The prompt with the context fragments it refers to read in (workers/fragments.py),
        and one Env.LoadFragment event per fragment, stamped now, to send with the span's end."""
        prompt, items = fragments.fill(self.job["prompt"])
        loaded = [
            self.emitter.build(
                "Env.LoadFragment",
                "instant",
                parent=self.start["span_id"],
                depth=self.job["depth"],
                **item,
            )
            for item in items
        ]
        return prompt, loaded

    def fail(self, deliver: Deliver, error: str, loaded: list[Event]) -> None:
        """End the Execute span as an error and deliver the error result."""
        result: Result = {**self.base, "status": "error", "error": error}
        self.finish(deliver, result, "error", loaded, error=error)

    def finish(
        self,
        deliver: Deliver,
        result: Result,
        status: str,
        loaded: list[Event] | None = None,
        *,
        payload: str | None = None,
        **fields: Any,
    ) -> None:
        """End the Execute span and deliver the signed result, with the events held for
        it (`loaded`) ahead of the end."""
        fields.setdefault("ms", (time.time_ns() - self.start["ts"]) / 1e6)
        end = self.emitter.build(
            SPAN,
            "end",
            span_id=self.start["span_id"],
            parent=self.start["parent_id"],
            depth=self.job["depth"],
            status=status,
            payload=payload,
            **fields,
        )
        deliver([*(loaded or ()), end], self.stream, signed(result))


def open_jobs(
    client: redis.Redis, jobs: list[Job], deliver: Deliver, send: RoundTrip | None = None
) -> list[Opened | None]:
    """Open these jobs together (step 1), in one round trip (`send`, by default one of its
    own): per job, its Opened, or None where it ended here (past its deadline, a model this
    worker cannot serve, cancelled), its result delivered."""
    venue, worker_id = venues.this_worker() or ("unknown", None)
    now = time.time()
    opened: list[Opened | None] = []
    for job in jobs:
        base: Result = {
            "run_id": job["run_id"],
            "sq_id": job["sq_id"],
            "venue": venue,
            "worker_id": worker_id or "",
        }
        stream = results_stream(job["run_id"])
        if now > job["deadline"]:
            deliver([], stream, signed({**base, "status": "cancelled"}))
            opened.append(None)
            continue
        try:
            spec = on_device(
                served(ModelSpec.from_dict(job["model"])), attempt=job.get("attempt", 1)
            )
        except ModelError as exc:
            deliver([], stream, signed({**base, "status": "error", "error": str(exc)}))
            opened.append(None)
            continue
        emitter = Emitter(client, job["run_id"], venue=venue, worker_id=worker_id)
        start = emitter.build(
            SPAN,
            "start",
            parent=job["submit_span"],
            depth=job["depth"],
            sq_id=job["sq_id"],
            model=spec.label,
        )
        opened.append(Opened(job, base, emitter, spec, start))
    live = [o for o in opened if o is not None]
    if not live:
        return opened
    # The conductor watches this process's alive line (workers/alive.py) for the jobs its
    # "started" names, and ends their Execute spans as abandoned if the line drops.
    alive = os.environ.get(ALIVE_ENV) == "1"

    def fill(pipe: Any) -> None:
        for o in live:
            pipe.sismember(cancelled_key(o.job["run_id"]), o.job["sq_id"])
        append([o.start for o in live], pipe)
        for o in live:
            started = {**o.base, "status": "started", "span": o.start["span_id"]}
            if alive:
                started["alive"] = "1"
            pipe.xadd(o.stream, encode_result(started))  # type: ignore[arg-type]

    cancelled = (send or round_trip_now(client))(fill)[: len(live)]
    ended: set[Opened] = set()
    for o, gone in zip(live, cancelled, strict=True):
        if gone:
            o.finish(deliver, {**o.base, "status": "cancelled"}, "cancelled")
            ended.add(o)
    return [None if o in ended else o for o in opened]


def _asking(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def execute(job: Job) -> bool:
    """One job alone, all three steps on this thread (a Celery task's job): two Redis round
    trips, the span's start with the cancel check, its end with the result. Whether it
    called the model."""
    client = get_redis()
    deliver = deliver_now(client)
    (opened,) = open_jobs(client, [job], deliver)
    return opened.work(deliver) if opened is not None else False
