"""A stack of its own for a test that kills its processes, so the session's `stack` is never
broken: its own Redis (on a free port) and state folder, the session's database and model
server. It has no recorder: the events stay in its Redis stream, where the test reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings

from frlm_web.stack import Proc, Stack, VenueSpec, free_port


class OwnStack(Stack):
    """Redis, a conductor, the venues' workers and (with a web port) the web server."""

    KEEP = ("redis", "conductor", "web")

    def plan(self) -> list[Proc]:
        return [p for p in super().plan() if p.name in self.KEEP or p.name.startswith("worker-")]

    def launch_run(self, run_id: str) -> None:
        """Hand a run to this stack's conductor (the test process's Celery app talks to the
        session's Redis)."""
        from frlm_web.celery import app

        with app.connection_for_write(url=self.redis_url) as conn:
            app.send_task("runs.conduct", args=[run_id], queue="runs", connection=conn)

    def launch_counting_run(self, n: int, venue: str) -> str:
        """Create and launch a run of one batch of `n` sub-queries on `venue` (three retries
        each), whose answer is how many came back with a reply; its id."""
        from runs.services import ContextSpec, run_create
        from tests.helpers import scripted
        from workers.backends import model_spec

        program = f"rs = llm_query_batched(['question %d' % i for i in range({n})])\n"
        program += "FINAL(str(sum(1 for r in rs if r and not r.startswith('[frlm'))))"
        run = run_create(
            question=scripted(program),
            context=ContextSpec(text="x"),
            policy={"max_retries": 3},
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=[venue],
        )
        self.launch_run(run.id)
        return run.id

    def ended(self, run_id: str, timeout: float = 120) -> tuple[Any, list[dict[str, Any]]]:
        """The run once it has ended, and its events once its span has: the run's row is
        written before its last events (Run.Done, then its span's end)."""
        from runs.models import Run
        from tests.helpers import wait_until

        def done() -> Run | None:
            found = Run.objects.get(id=run_id)
            return found if found.done else None

        run = wait_until(done, timeout=timeout, what="the run to end")
        events = wait_until(
            lambda: (
                (ev := self.events(run_id))
                and any(e["name"] == "Run.Init" and e["phase"] == "end" for e in ev)
                and ev
            ),
            timeout=10,
            what="the run's span to end",
        )
        return run, events

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in stream order."""
        out = []
        for _, fields in self.client.xrange("frlm:events"):
            event = json.loads(fields[b"e"])
            if event["run_id"] == run_id:
                out.append({**event, "seq": int(fields[b"seq"])})
        return out


@contextmanager
def own_stack(tmp_path: Path, venues: list[VenueSpec], *, web: bool = False) -> Iterator[OwnStack]:
    env = {
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DB_PATH": settings.DATABASES["default"]["NAME"],
        "FRLM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    running = OwnStack(
        state_dir=tmp_path / "own-stack",
        venues=venues,
        env=env,
        web_port=free_port() if web else None,
        start_redis=True,
        redis_persist=False,
        conductor_concurrency=2,
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()


def open_spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Span starts without an end."""
    ended = {e["span_id"] for e in events if e["phase"] == "end"}
    return [e for e in events if e["phase"] == "start" and e["span_id"] not in ended]
