"""A broker worker killed with -9 while the results of jobs it finished have not reached Redis:
handed over to its delivery thread (workers/delivery.py), whose round trip is stuck on the
way. Those results are lost with the process, as the jobs still running are: the conductor
reads the death from the worker's alive line, ends the Execute spans it left open as
abandoned, sends the jobs elsewhere, and the run succeeds with every reply.

The worker reaches Redis through a proxy of the test's own that can stop passing what the
worker sends (its replies held, as on a path that stalled), so the kill finds finished
results sitting in the worker, not a chance timing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

from frlm_web import presence
from frlm_web.stack import VenueSpec
from runs.cli import format_summary, summarise
from tests.helpers import wait_until
from tests.ownstack import open_spans, own_stack

pytestmark = [pytest.mark.stack]

N = 32
LATENCY_MS = 300


class StallingProxy:
    """TCP on loopback to `upstream`; once `stall()` is called, what clients send is kept
    back (and dropped when the client goes), while what the server sends still passes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stalled = threading.Event()
        self.held = 0  # bytes kept back
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalled.set()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                if self.stalled.is_set():
                    self.held += len(data)
                else:
                    server.sendall(data)
        except OSError:
            pass
        finally:  # the client went: so does its connection to the server, held bytes unsent
            for sock in (server, client):
                sock.close()

    @staticmethod
    def _down(server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (server, client):
                sock.close()


def via(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, _, _hostport = parts.netloc.rpartition("@")
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def test_results_a_killed_worker_had_not_delivered_are_run_again_elsewhere(stack, tmp_path):
    other = VenueSpec(
        "local", concurrency=4, sim={"latency_ms": LATENCY_MS}, worker_name="deliver-w2"
    )
    with own_stack(tmp_path, [other]) as own:
        victim_spec = VenueSpec(
            "local", concurrency=4, sim={"latency_ms": LATENCY_MS}, worker_name="deliver-w1"
        )
        argv = own.venue_proc(victim_spec).argv
        env = own.role_env("worker")
        redis_url = urlsplit(env["FRLM_REDIS_URL"])
        proxy = StallingProxy((redis_url.hostname or "127.0.0.1", redis_url.port or 6379))
        env["FRLM_REDIS_URL"] = via(env["FRLM_REDIS_URL"], proxy.port)
        log = open(tmp_path / "victim.log", "ab")  # noqa: SIM115
        victim_proc = subprocess.Popen(
            argv, cwd=settings.BASE_DIR, env={**os.environ, **env}, stdout=log, stderr=log
        )
        try:

            def registered() -> str | None:
                alive = presence.alive(own.client, "venue:local")
                return next((w["worker_id"] for w in alive if w["label"] == "deliver-w1"), None)

            victim = wait_until(registered, timeout=60, what="the victim worker to register")
            run_id = own.launch_counting_run(N, "local")

            def victim_started() -> list[dict]:
                return [
                    e
                    for e in own.events(run_id)
                    if e["name"] == "SubQuery.Execute"
                    and e["phase"] == "start"
                    and e["worker_id"] == victim
                ]

            wait_until(victim_started, timeout=60, every=0.01, what="the victim's first jobs")
            proxy.stall()
            stalled_ns = time.time_ns()
            # Its jobs end after the model's latency: their results are handed over to its
            # delivery thread, whose round trip the proxy holds.
            time.sleep(3 * LATENCY_MS / 1000)
            victim_proc.send_signal(signal.SIGKILL)
            victim_proc.wait(timeout=30)

            run, events = own.ended(run_id)
        finally:
            if victim_proc.poll() is None:
                victim_proc.kill()
                victim_proc.wait(timeout=30)
            proxy.close()
            log.close()
        assert run.status == "succeeded", run.error
        assert run.answer == str(N)
        assert proxy.held > 0  # the victim did send something that never arrived
        (lost,) = [e for e in events if e["name"] == "Worker.Lost"]
        assert lost["worker_id"] == victim
        executes = [e for e in events if e["name"] == "SubQuery.Execute"]
        started_before = {
            e["span_id"]
            for e in executes
            if e["phase"] == "start" and e["worker_id"] == victim and e["ts"] < stalled_ns
        }
        abandoned = {
            e["span_id"] for e in executes if e["phase"] == "end" and e["status"] == "abandoned"
        }
        # Jobs that began before the stall had their replies well before the kill: each one
        # abandoned is a result that sat in the worker, finished but not delivered.
        assert started_before & abandoned
        assert all(
            e["worker_id"] == victim
            for e in executes
            if e["phase"] == "end" and e["status"] == "abandoned"
        )
        assert open_spans(events) == []
        assert [e for e in events if e["name"] == "SubQuery.Retry"]
        # The run's summary and page name the worker it lost, and what it held then.
        (said,) = run.lost_workers
        assert (said["worker_id"], said["venue"]) == (victim, "local")
        assert said["held"] >= len(started_before & abandoned) >= 1
        assert said["text"].startswith(f"worker {victim} of venue local left while it held ")
        assert f"lost       {said['text']}" in format_summary(summarise(run))
