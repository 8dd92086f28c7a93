"""Shared steps of the end-to-end tests: launch a run through the services, wait for it,
read its trace."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import transaction

from runs.models import Run
from runs.services import ContextSpec, run_create, run_launch
from traces import store
from workers.backends import ModelSpec, model_spec


def wait_until(
    check: Callable[[], Any], timeout: float = 30.0, every: float = 0.1, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def local_venue():
    """The venue `local` as registration makes it, trusted: a test's own row of that name
    is the one the stack's workers restore theirs into after the tables are emptied (one
    made untrusted left a stack worker untrusted, and the trust tests after it failed)."""
    from workers.models import Venue, venue_defaults

    return Venue.objects.get_or_create(name="local", defaults=venue_defaults("local"))[0]


def scripted(*cells: str) -> str:
    """A question that makes the simulated root model write exactly these cells, in order."""
    return "Run this program.\n" + "\n".join(f"```repl\n{cell.strip()}\n```" for cell in cells)


def launch(
    *,
    question: str = "",
    text: str | None = None,
    task: str | None = None,
    tokens: int = 20_000,
    seed: int = 1,
    venues: list[str] | None = None,
    policy: dict[str, Any] | None = None,
    worker_sim: dict[str, Any] | None = None,
    worker_base_url: str | None = None,
    root: ModelSpec | None = None,
    worker_model: ModelSpec | None = None,
) -> Run:
    worker = worker_model or model_spec("sim", role="worker", base_url=worker_base_url)
    if worker_sim:
        worker = ModelSpec(worker.kind, worker.model, worker.base_url, worker_sim)
    context = (
        ContextSpec(task=task, tokens=tokens, seed=seed) if task else ContextSpec(text=text or "x")
    )
    with transaction.atomic():
        run = run_create(
            question=question,
            context=context,
            policy=policy,
            root_model=root or model_spec("sim", role="root"),
            worker_model=worker,
            venues=venues or ["local", "edge"],
        )
        run_launch(run)
    return run


def bare_run(question: str = "q", **fields: Any) -> Run:
    """A Run row with no context and no models, for pages and APIs that read only its
    row and its stored trace; `fields` set the rest (owner, status, ...)."""
    fields.setdefault("context_source", "text")
    return Run.objects.create(
        question=question, context_path="/dev/null", root_model={}, worker_model={}, **fields
    )


def finish(run: Run, timeout: float = 90.0) -> Run:
    def done() -> bool:
        run.refresh_from_db()
        return run.done

    wait_until(done, timeout=timeout, what=f"run {run.id} to finish")
    return run


def trace(run: Run, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The run's stored events, once the recorder has stored the last one a run emits: the
    end of its Run.Init span (it comes after Run.Done, possibly in a later batch)."""

    def stored() -> list[dict[str, Any]] | None:
        events = store.read_events(run.id)
        done = any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events)
        return events if done else None

    return wait_until(stored, timeout=timeout, what=f"trace of {run.id}")


def stack_worker_ids() -> set[str]:
    """The ids under which the stack's workers registered (traces and presence use them;
    their names, e.g. local-t1, are labels)."""
    from frlm_web.redis_client import get_redis
    from tests.conftest import TEST_VENUES
    from workers.venues import live_workers

    return {
        w["worker_id"]
        for v in TEST_VENUES
        for w in live_workers(get_redis(), v.name)
        if w.get("label") == v.member
    }


def named(
    events: list[dict[str, Any]], name: str, phase: str | None = None
) -> list[dict[str, Any]]:
    return [e for e in events if e["name"] == name and (phase is None or e["phase"] == phase)]


@contextmanager
def endpoint(
    answer: Callable[[dict[str, Any]], tuple[int, bytes]],
    *,
    port: int = 0,
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A one-route OpenAI-like server on 127.0.0.1: `answer` turns each POST (its path,
    headers, JSON body or None when not JSON, and `raw` bytes) into a status and body.
    Yields its base URL and the requests seen. `port`: a given one (a server that comes
    up where a client was already told to look), else any free one."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                body = None
            request = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
                "raw": raw,
            }
            seen.append(request)
            status, reply = answer(request)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: object) -> None:
            pass

    with http_serving(Handler, port=port) as url:
        yield url, seen


@contextmanager
def http_serving(handler: type[BaseHTTPRequestHandler], *, port: int = 0) -> Iterator[str]:
    """`handler` served on 127.0.0.1 from a thread; yields the base URL (…/v1)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def forget_reputations() -> None:
    """The stack's workers start from no evidence: reputation lives in the session's Redis,
    and a test that counts replicas must not depend on how many runs came before it (the
    redundant tier copies all of a new worker's work, then check_floor of it, from a phase
    kept in the worker's record)."""
    from frlm_web.redis_client import get_redis
    from workers.reputation import rep_key

    client = get_redis()
    client.delete(*[rep_key(wid) for wid in stack_worker_ids()] or ["frlm:rep:-"])
