"""The escape battery: hostile REPL programs, each either contained or refused.

Every program is what a signed-in user (or a prompt injection in the context) can make the
root model run. Each runs in a real REPL process under bubblewrap, as the conductor starts
it, against a host that holds secrets the program hunts for: a secret in another process's
environment, a 0600 key file, the database, a listening TCP port and an abstract unix
socket. After each, the same REPL (or its replacement) must still answer a plain cell.

The same programs, with bubblewrap unavailable and the default isolation (``auto``), must
be refused before a run exists: nothing runs unisolated unless the operator says ``none``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from string import Template

import pytest
from django.conf import settings

from runs.sandbox import Sandbox, SandboxError, SandboxLimits, isolation_problem
from runs.sandbox.bwrap import CHILD_SCRIPT
from tests.pages.helpers import launcher_form
from tests.runs.escape_programs import LIMITS, PROGRAMS, Host, Program

_NO_BWRAP = isolation_problem("bwrap")
# The refusals below run everywhere; containment needs bubblewrap to contain.
needs_bwrap = pytest.mark.skipif(_NO_BWRAP is not None, reason=f"no bubblewrap: {_NO_BWRAP}")

CONTEXT = "The launch code is in the vault.\n" * 100


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("host")
    secret = "frlm-canary-" + os.urandom(8).hex()
    secret_file = root / "conductor.key"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    context = root / "context.txt"
    context.write_text(CONTEXT)
    canary = subprocess.Popen(
        ["sleep", "600"], env={"PATH": "/usr/bin:/bin", "FRLM_SECRET_KEY": secret}
    )
    listener = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = "frlm-canary-" + os.urandom(4).hex()
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    state = Host(
        secret=secret,
        root=root,
        secret_file=secret_file,
        context=context,
        port=listener.getsockname()[1],
        abstract=abstract_name,
        canary_pid=canary.pid,
    )

    def accept(server: socket.socket, what: str) -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            state.connections.append(what)
            connection.close()

    for server, what in ((listener, "tcp"), (abstract, "abstract")):
        threading.Thread(target=accept, args=(server, what), daemon=True).start()
    yield state
    canary.kill()
    canary.wait()
    listener.close()
    abstract.close()


@pytest.fixture
def sandbox(host: Host, tmp_path: Path) -> Iterator[Sandbox]:
    with Sandbox(
        host.context, handler=_handler, limits=LIMITS, workdir_root=tmp_path, isolation="bwrap"
    ) as started:
        yield started


def _handler(name: str, kwargs: dict[str, object]) -> object:
    return "ok"


def _survivors(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                pids.append(int(entry))
    return pids


def _host_files(host: Host) -> dict[str, str]:
    """What the programs must not change on the host."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in (host.context, host.secret_file, CHILD_SCRIPT)
    }


@needs_bwrap
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_a_hostile_program_is_contained(program: Program, host: Host, tmp_path: Path) -> None:
    before = _host_files(host)
    connections = len(host.connections)
    limits = LIMITS if program.wall_s is None else _with_wall(program.wall_s)
    code = Template(program.code).substitute(host.fields())
    with Sandbox(
        host.context, handler=_handler, limits=limits, workdir_root=tmp_path, isolation="bwrap"
    ) as sandbox:
        result = sandbox.execute(code)
        said = result.stdout + result.stderr
        assert host.secret not in said
        assert "GOT" not in result.stdout, result.stdout
        program.check(result, host)
        # The REPL (or the fresh one that replaced it) still answers a plain cell. A thread
        # the program left behind may spoil the next cell; the host then sees the forgery and
        # replaces the REPL, and the cell after that works.
        plain = sandbox.execute("print(len(context))")
        if plain.error == "crashed" and plain.restarted:
            assert "control pipe" in (plain.error_message or "")
            plain = sandbox.execute("print(len(context))")
        assert str(len(CONTEXT)) in plain.stdout, (plain.error, plain.stderr[-500:])
    assert _host_files(host) == before
    assert len(host.connections) == connections
    assert not (host.root / "pwned").exists()
    assert not Path("/etc/pwned").exists() and not Path("/usr/pwned").exists()
    # Nothing it started lives on once the sandbox is closed.
    time.sleep(0.1)
    assert _survivors("613.25") == []
    assert list(tmp_path.iterdir()) == []


def _with_wall(wall_s: float) -> SandboxLimits:
    return SandboxLimits(
        cell_wall_s=wall_s,
        cpu_s=LIMITS.cpu_s,
        memory_mb=LIMITS.memory_mb,
        output_chars=LIMITS.output_chars,
        scratch_mb=LIMITS.scratch_mb,
    )


def test_the_battery_has_at_least_thirty_programs_and_the_readme_counts_them() -> None:
    assert len(PROGRAMS) >= 30
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"escape battery: {len(PROGRAMS)} hostile programs" in readme


# -- without bubblewrap: refused before anything runs -----------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(settings, "FRLM_SANDBOX_ISOLATION", "auto")
    assert shutil.which("bwrap") is None


@pytest.mark.django_db
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_without_bubblewrap_the_program_is_refused(
    program: Program, host: Host, tmp_path: Path, no_bwrap: None
) -> None:
    """Before issue 17 ``auto`` fell back to rlimits only and ran these as the service user."""
    from runs.models import Run
    from runs.services import ContextSpec, RunInputError, run_create
    from tests.helpers import scripted
    from workers.backends import model_spec

    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()\n" + Template(program.code).substitute(
        host.fields()
    )
    with pytest.raises(RunInputError) as refusal:
        run_create(
            question=scripted(code),
            context=ContextSpec(text=CONTEXT),
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )
    message = refusal.value.errors["sandbox"]
    assert "bubblewrap is not installed" in message
    assert "FRLM_SANDBOX_ISOLATION=none" in message
    assert not Run.objects.exists()
    # And the sandbox itself, asked directly, refuses too.
    with pytest.raises(SandboxError, match="FRLM_SANDBOX_ISOLATION=none"):
        Sandbox(host.context, handler=_handler, workdir_root=tmp_path / "w").start()
    assert not marker.exists()


@pytest.mark.django_db
def test_the_launcher_says_why_a_run_is_refused(client, no_bwrap: None) -> None:
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("sam", password="pw-for-tests"))
    form = client.get("/runs/new").content.decode()
    assert "Runs cannot start on this server." in form
    assert "apt-get install -y bubblewrap" in form
    reply = client.post(
        "/runs/new",
        launcher_form(
            question="What is the launch code? ```repl\nprint(open('/etc/shadow').read())\n```",
            task_tokens=40_000,
        ),
    )
    assert reply.status_code == 400
    page = reply.content.decode()
    assert "the REPL sandbox cannot start: bubblewrap is not installed" in page
    assert "FRLM_SANDBOX_ISOLATION=none" in page
    assert "What is the launch code?" in page  # what the user typed is kept


@needs_bwrap
def test_killing_the_host_side_leaves_no_repl_behind(host: Host, tmp_path: Path) -> None:
    """The conductor's thread dies (here: the sandbox is dropped without close, and its
    bubblewrap killed): --die-with-parent and the pid namespace take the REPL with it."""
    sandbox = Sandbox(host.context, handler=_handler, limits=LIMITS, workdir_root=tmp_path)
    sandbox.start()
    sandbox.execute("import os\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '613.5'])")
    deadline = time.monotonic() + 5
    while not _survivors("613.5") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _survivors("613.5")
    child = sandbox._child  # noqa: SLF001 - the REPL's bubblewrap, killed as a crash would
    assert child is not None
    os.killpg(child.pid, signal.SIGKILL)
    sandbox.close()
    time.sleep(0.2)
    assert _survivors("613.5") == []


# -- opted out by name: said where no one can miss it -----------------------------------------


@pytest.mark.django_db
def test_an_unisolated_run_is_marked_on_its_page_and_in_frlm_run(client, host: Host) -> None:
    from django.contrib.auth.models import User

    from runs.cli import format_summary, summarise
    from runs.models import Run

    with Sandbox(host.context, handler=_handler, workdir_root=host.root, isolation="none") as s:
        isolation = s.isolation
    assert isolation.startswith("NOT ISOLATED (FRLM_SANDBOX_ISOLATION=none)")
    owner = User.objects.create_user("kim", password="pw-for-tests")
    run = Run.objects.create(
        question="q",
        root_model={"kind": "sim", "model": "frlm-sim-root"},
        worker_model={"kind": "sim", "model": "frlm-sim-worker"},
        venues=["local"],
        status=Run.Status.SUCCEEDED,
        isolation=isolation,
        owner=owner,
    )
    assert run.unisolated
    client.force_login(owner)
    page = client.get(f"/runs/{run.id}").content.decode()
    assert 'id="run-unisolated"' in page and "NOT ISOLATED." in page
    printed = format_summary(summarise(run))
    assert "WARNING    the REPL ran WITHOUT A SANDBOX" in printed
