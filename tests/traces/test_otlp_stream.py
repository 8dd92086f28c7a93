"""FRLM_OTLP_ENDPOINT: the recorder pushes every finished run to an OTLP/HTTP collector once
the run's events are stored; a collector that is down gets the run later, also across a
recorder restart, and a run is not pushed twice."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from frlm_web.stack import Stack, free_port
from tests.helpers import endpoint, finish, launch, scripted, wait_until
from traces import store

pytestmark = [pytest.mark.stack]


@contextmanager
def streaming_recorder(stack: Stack, port: int) -> Iterator[None]:
    """The session's recorder, restarted with the stream set to 127.0.0.1:port; the
    ordinary recorder again afterwards."""
    settings = {
        "FRLM_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "FRLM_OTLP_HEADERS": "x-tenant=frlm%20stream",
    }
    stack.kill("recorder", signal.SIGTERM)
    stack.env.update(settings)
    try:
        stack.restart("recorder")
        yield
    finally:
        stack.kill("recorder", signal.SIGTERM)
        for key in settings:
            stack.env.pop(key, None)
        stack.restart("recorder")


def accept(request: dict[str, Any]) -> tuple[int, bytes]:
    return 200, b""


def pushed_runs(seen: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Each request's run id (its root span's frlm.run_id) and root span, decoded through
    the official protobuf schema."""
    found = []
    for request in seen:
        message = ExportTraceServiceRequest()
        message.ParseFromString(request["raw"])
        spans = message.resource_spans[0].scope_spans[0].spans
        root = next(s for s in spans if not s.parent_span_id)
        found.append((attr(root, "langfuse.trace.name").removeprefix("frlm run "), root, spans))
    return found


def attr(span: Any, key: str) -> Any:
    for item in span.attributes:
        if item.key == key:
            return getattr(item.value, item.value.WhichOneof("value"))
    return None


def finished_run(answer: str) -> Any:
    run = finish(launch(question=scripted(f"r = llm_query('say {answer}')\nFINAL({answer!r})")))
    assert run.status == "succeeded", run.error
    return run


def test_it_pushes_every_finished_run_once_its_events_are_stored(stack, venues):
    port = free_port()
    with streaming_recorder(stack, port), endpoint(accept, port=port) as (_, seen):
        run = finished_run("streamed")
        wait_until(lambda: seen, timeout=60, what="the collector to receive the run")
        [(run_id, root, spans)] = pushed_runs(seen)
        assert run_id == run.id
        assert seen[0]["path"] == "/v1/traces"
        assert seen[0]["headers"]["content-type"] == "application/x-protobuf"
        assert seen[0]["headers"]["x-tenant"] == "frlm stream"
        assert root.name == "Run.Init"
        assert attr(root, "langfuse.trace.input") == run.question
        assert attr(root, "langfuse.trace.output") == "streamed"
        events = store.read_events(run.id)
        assert len(spans) == len({e["span_id"] for e in events if e["phase"] == "end"})


def test_a_collector_down_at_first_gets_the_run_later_even_across_a_restart(stack, venues):
    port = free_port()  # nothing listens there yet: the collector is down
    start = recorder_log(stack).stat().st_size
    with streaming_recorder(stack, port):
        first = finished_run("early")
        wait_until(
            lambda: "cannot reach the collector" in log_since(stack, start),
            timeout=60,
            what="the recorder to fail to push",
        )
        with endpoint(accept, port=port) as (_, seen):
            wait_until(lambda: seen, timeout=60, what="the run pushed once the collector is up")
            wait_until(lambda: "works again" in log_since(stack, start), timeout=10, what="the log")
        assert [r for r, _, _ in pushed_runs(seen)] == [first.id]
        log = log_since(stack, start)
        assert log.count("cannot reach the collector") == 1  # once per kind of failure
        assert "works again" in log

        # Down again: a run finishes, the recorder restarts, then the collector comes up.
        second = finished_run("late")
        wait_until(
            lambda: store.event_count(second.id) > 0 and _queued(second.id),
            timeout=60,
            what="the second run to be queued",
        )
        stack.kill("recorder", signal.SIGTERM)
        stack.restart("recorder")
        with endpoint(accept, port=port) as (_, seen):
            wait_until(lambda: seen, timeout=60, what="the queued run pushed after a restart")
            time.sleep(2)  # time enough for a second push, which must not come
        assert [r for r, _, _ in pushed_runs(seen)] == [second.id]  # the first not again


def recorder_log(stack: Stack) -> Path:
    return stack.state_dir / "logs" / "recorder.log"


def log_since(stack: Stack, offset: int) -> str:
    with open(recorder_log(stack), "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def _queued(run_id: str) -> bool:
    from django.conf import settings

    path = settings.FRLM_TRACE_DIR / "otlp_stream.jsonl"
    return path.exists() and run_id in path.read_text()


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"FRLM_OTLP_ENDPOINT": "localhost:4318"}, "must be an http(s) URL"),
        (
            {"FRLM_OTLP_ENDPOINT": "http://localhost:4318", "FRLM_OTLP_HEADERS": "novalue"},
            "expected KEY=VALUE",
        ),
        ({"FRLM_OTLP_ENDPOINT": "http://localhost:4318", "FRLM_OTLP_PAYLOADS": "no"}, "0 or 1"),
    ],
)
def test_a_bad_stream_setting_stops_the_recorder_with_what_to_fix(subprocess_env, setting, said):
    done = subprocess.run(
        [sys.executable, "manage.py", "frlm_recorder"],
        env={**subprocess_env, **setting},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert said in done.stderr and "FRLM_OTLP" in done.stderr
    assert "Traceback" not in done.stderr
