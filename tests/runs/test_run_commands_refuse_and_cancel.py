"""The run commands (frlm_run, frlm_replay) as a researcher uses them: refused in one line,
with nothing made, when Redis or a conductor is missing; the run cancelled on Ctrl-C and on
SIGTERM (a `timeout`, a cancelled CI job), not left spending with nobody waiting (a review
found each; every test here failed before). And a run the broker did not take is failed
with the reason, not left queued for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings

from frlm_web.stack import free_port
from runs.models import Run
from tests.helpers import local_venue


def finished_run_with_a_trace() -> Run:
    """A succeeded run whose context is readable and whose trace is stored: what
    frlm_replay's own checks accept."""
    from runs.engine.context import context_dir
    from traces.emitter import Emitter
    from traces.recorder import _write_segment

    local_venue()
    path = context_dir() / "review-cli.txt"
    path.write_text("hello\n")
    sim_root = {"kind": "sim", "model": "frlm-sim-root", "base_url": "http://127.0.0.1:1"}
    sim_worker = {"kind": "sim", "model": "frlm-sim-worker", "base_url": "http://127.0.0.1:1"}
    run = Run.objects.create(
        question="q",
        context_source=Run.Source.TEXT,
        context_path=str(path),
        status=Run.Status.SUCCEEDED,
        venues=["local"],
        root_model=sim_root,
        worker_model=sim_worker,
    )
    emitter = Emitter(None, run.id)  # type: ignore[arg-type]
    events = [
        emitter.build("Run.Init", "start", span_id="a" * 16),
        emitter.build("Run.Init", "end", span_id="a" * 16),
    ]
    for seq, event in enumerate(events, 1):
        event["seq"] = seq
    _write_segment(run.id, events, first_id="1-0")
    return run


def manage_env(redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DB_PATH": settings.DATABASES["default"]["NAME"],
        "FRLM_REDIS_URL": redis_url,
        "FRLM_SANDBOX_ISOLATION": "none",
    }


@pytest.mark.django_db(transaction=True)
def test_replay_refuses_in_one_line_when_redis_is_down_and_leaves_no_run():
    """frlm_run and frlm_import say "Redis is not reachable" in one line; frlm_replay
    saved the replay's row, then died in a kombu OperationalError traceback, leaving a run
    `queued` for ever."""
    source = finished_run_with_a_trace()
    before = set(Run.objects.values_list("id", flat=True))
    done = subprocess.run(
        [sys.executable, "manage.py", "frlm_replay", source.id, "--json"],
        env=manage_env(f"redis://127.0.0.1:{free_port()}/0"),  # nothing listens there
        capture_output=True,
        text=True,
        timeout=120,
    )
    left = Run.objects.exclude(id__in=before)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr[-600:]
    assert "Redis" in done.stderr
    assert list(left.values_list("id", "status")) == []  # nothing half-made


@pytest.fixture
def bare_redis(tmp_path):
    """A Redis of its own with nothing else on it: no conductor, no workers."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


@pytest.mark.django_db(transaction=True)
def test_replay_refuses_at_once_when_no_conductor_is_running(bare_redis):
    """frlm_run answers "no conductor is running; start everything with `make up`" at
    once; frlm_replay queues its run and waits for it the whole --timeout (an hour by
    default), drawing an empty progress bar, with nothing that will ever take the run."""
    source = finished_run_with_a_trace()
    env = {**manage_env(bare_redis), "FRLM_REDIS_ACL": "0"}
    try:
        done = subprocess.run(
            [sys.executable, "manage.py", "frlm_replay", source.id],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        stuck = list(Run.objects.filter(replay_of=source).values_list("id", "status"))
        pytest.fail(
            f"frlm_replay still waiting after 30 s with no conductor; runs: {stuck}; "
            f"stderr: {(exc.stderr or b'')[-300:]!r}"
        )
    assert done.returncode == 1 and "conductor" in done.stderr, done


def _started(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", *cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _running(query) -> Run:
    from tests.helpers import wait_until

    return wait_until(
        lambda: query.filter(status=Run.Status.RUNNING).first(), timeout=60, what="a running run"
    )


def _interrupted(cmd: list[str], runs, env: dict[str, str], sig=signal.SIGINT):
    """Start the command, send it `sig` once its run is running, and wait for the run to
    end: (the run, the command's process, what it wrote on stderr)."""
    from tests.helpers import wait_until

    proc = _started(cmd, env)
    try:
        run = _running(runs)
        time.sleep(1.0)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = wait_until(
        lambda: (lambda r: r if r.done else None)(Run.objects.get(id=run.id)),
        timeout=60,
        what="the run to end",
    )
    return run, proc, err


@pytest.mark.stack
def test_ctrl_c_during_a_replay_cancels_the_replay(venues, subprocess_env):
    """frlm_run cancels its run on Ctrl-C ("cancelled run R", exit 1); frlm_replay has no
    such handler: Ctrl-C prints a KeyboardInterrupt traceback and the replay it launched
    runs on to its end, unwatched, on the conductor and the workers."""
    from tests.helpers import finish, launch, scripted

    slow = scripted("import time\ntime.sleep(8)\nprint('slept')", "FINAL('done')")
    original = finish(launch(question=slow, venues=["local"]))
    assert original.status == "succeeded", original.error
    copy, proc, err = _interrupted(
        ["frlm_replay", original.id], Run.objects.filter(replay_of=original), subprocess_env
    )
    seen = (copy.status, copy.answer, proc.returncode, "Traceback" in err, err[-200:])
    assert copy.status == Run.Status.CANCELLED, seen
    assert "Traceback" not in err and proc.returncode == 1, seen


@pytest.mark.stack
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_during_frlm_run_cancels_the_run(venues, subprocess_env, context_root, sig):
    """Ctrl-C cancels frlm_run's run; SIGTERM (what `timeout 60 manage.py frlm_run ...`,
    a CI job's cancel or a closing tmux pane sends) kills the command and leaves its run
    going on the conductor and the workers, spending, with nobody waiting for it."""
    from tests.helpers import scripted

    notes = context_root / "notes.txt"
    notes.write_text("The launch window opens on Tuesday.\n")
    slow = scripted("import time\ntime.sleep(8)\nprint('slept')", "FINAL('done')")
    before = set(Run.objects.values_list("id", flat=True))
    run, proc, _err = _interrupted(
        ["frlm_run", "--question", slow, "--context", str(notes), "--venues", "local"],
        Run.objects.exclude(id__in=before),
        subprocess_env,
        sig,
    )
    assert run.status == Run.Status.CANCELLED, (run.status, run.answer, proc.returncode)


def _broker_down(monkeypatch) -> None:
    """The broker refuses the run's message, as kombu does when Redis went away after the
    page or command looked."""
    from kombu.exceptions import OperationalError

    from frlm_web.celery import app

    def refuse(*_args, **_kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", refuse)


@pytest.mark.django_db(transaction=True)
def test_a_run_the_broker_does_not_take_is_failed_with_the_reason(monkeypatch):
    from runs.services import ContextSpec, RunLaunchError, run_create, run_launch
    from workers.backends import model_spec

    local_venue()
    run = run_create(
        question="q",
        context=ContextSpec(text="some context"),
        root_model=model_spec("sim", role="root"),
        worker_model=model_spec("sim", role="worker"),
        venues=["local"],
    )
    _broker_down(monkeypatch)
    with pytest.raises(RunLaunchError, match="Redis did not take it"):
        run_launch(run)
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and run.finished is not None
    assert "could not be handed to a conductor" in run.error and "make up" in run.error


def test_the_launcher_keeps_what_was_typed_when_the_broker_does_not_take_the_run(
    venues, monkeypatch
):
    from django.test import Client

    from tests.pages.helpers import launcher_form, make_user

    before = set(Run.objects.values_list("id", flat=True))
    client = Client()
    client.force_login(make_user("ops", staff=True))
    _broker_down(monkeypatch)
    form = launcher_form(question="Where is the needle?", task_tokens="1000")
    response = client.post("/runs/new", form)
    page = response.content.decode()
    assert response.status_code == 400, page[:2000]
    assert "Redis did not take it" in page and "make up" in page
    assert "Where is the needle?" in page  # kept, to send again
    made = Run.objects.exclude(id__in=before)
    assert list(made.values_list("status", flat=True)) == [Run.Status.FAILED]
