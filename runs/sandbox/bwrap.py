"""The REPL's command line: the base interpreter running child.py with an environment built
from nothing, inside bubblewrap, as an unprivileged user when the service runs as root.

As root, bubblewrap sets the sandbox up with root's rights (so it can mount an interpreter
that lives under /root) and setpriv, inside it, becomes ``nobody`` with no capabilities and
no way back before the REPL starts. Not as root, bubblewrap runs unprivileged in a user
namespace of its own. Either way host data reaches the REPL only as descriptors: child.py's
three files are copied in from descriptors, and the context and its index are read from
descriptors the REPL inherits, so its user needs no right to open them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from runs.sandbox import seccomp

CHILD_SCRIPT = Path(__file__).resolve().with_name("child.py")
# The only project code the REPL sees: the child and the two stdlib-only modules it imports.
CHILD_MODULES = tuple(CHILD_SCRIPT.with_name(name) for name in ("lazytext.py", "patterns.py"))
_CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"
INSTALL_HINT = (
    "install bubblewrap (`apt-get install -y bubblewrap`) and allow user namespaces, "
    "or run without isolation by setting FRLM_SANDBOX_ISOLATION=none (the REPL's code can "
    "then read this machine's files and secrets)"
)


@dataclass
class Mounts:
    """Descriptors the host opened for one REPL start; closed once the REPL has started."""

    fds: list[int] = field(default_factory=list)

    def open(self, path: Path | str, flags: int) -> int:
        fd = os.open(path, flags | os.O_CLOEXEC)
        self.fds.append(fd)
        return fd

    def data(self, name: str, content: bytes) -> int:
        """A descriptor holding ``content`` from its start (bubblewrap reads it to the end)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        self.fds.append(fd)
        os.write(fd, content)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


# Inside bubblewrap the scratch space is a tmpfs of its own at /tmp, whatever the host uses,
# and the REPL's own code sits in a fixed place beside it (the checkout may live in /tmp).
SANDBOX_SCRATCH = Path("/tmp")
SANDBOX_CODE = Path("/frlm")


def repl_command(
    env: dict[str, str],
    mounts: Mounts,
    *,
    bwrap: bool,
    scratch_bytes: int,
    user: tuple[int, int] | None,
    program: list[str] | None = None,
) -> list[str]:
    """The command that starts child.py (or ``program``), wrapped in bubblewrap when
    ``bwrap``, started as ``user`` (uid, gid) when given. Descriptors it needs are opened
    into ``mounts``."""
    interpreter = base_interpreter()
    script = SANDBOX_CODE / CHILD_SCRIPT.name if bwrap else CHILD_SCRIPT
    command = program or [str(interpreter), "-I", "-S", str(script)]
    if user is not None:
        command = [*drop_to(user), *command]
    if bwrap:
        prefix = bwrap_arguments(env, scratch_bytes, mounts, privileged=user is not None)
        command = [*prefix, "--", *command]
    return command


def drop_to(user: tuple[int, int]) -> list[str]:
    """setpriv's arguments to become ``user`` with no groups, no capabilities (not even in
    the bounding set) and no way to gain privileges through a setuid program."""
    uid, gid = user
    return [
        "/usr/bin/setpriv",
        *(f"--reuid={uid}", f"--regid={gid}", "--clear-groups"),
        *("--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"),
        "--",
    ]


def sandbox_user(uid: int) -> tuple[int, int] | None:
    """Whom the REPL runs as: ``uid`` (with the same gid) when the service is root, else
    nobody different (an unprivileged service cannot change user, and needs not)."""
    if os.geteuid() != 0:
        return None
    return uid, uid


def clean_env(scratch: Path) -> dict[str, str]:
    """Built from nothing: the host's environment holds API keys the REPL must not see."""
    return {
        "PATH": _CHILD_PATH,
        "LANG": "C.UTF-8",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def base_interpreter() -> Path:
    """The interpreter behind the venv: child.py needs only the standard library."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = Path(sys.base_prefix) / "bin" / version
    if candidate.exists():
        return candidate.resolve()
    return Path(sys.executable).resolve()


def setpriv_path() -> str | None:
    # Inside the sandbox only /usr is there, so the one under /usr/bin is the one used.
    return "/usr/bin/setpriv" if os.access("/usr/bin/setpriv", os.X_OK) else None


def bwrap_problem(user: tuple[int, int] | None) -> str | None:
    """Why bubblewrap cannot be used here (as ``user``), or None when it works."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed"
    if user is not None and setpriv_path() is None:
        return "setpriv (util-linux) is not installed, so the REPL cannot leave the root user"
    return _probe_bwrap(bwrap, user)


@functools.cache
def _probe_bwrap(bwrap: str, user: tuple[int, int] | None) -> str | None:
    # Containers often ship bwrap but forbid the namespaces it needs; only a real start of
    # the same command line, as the same user, tells.
    mounts = Mounts()
    try:
        program = [str(base_interpreter()), "-I", "-S", "-c", "open('probe', 'w').close()"]
        command = repl_command(
            clean_env(SANDBOX_SCRATCH),
            mounts,
            bwrap=True,
            scratch_bytes=1 << 20,
            user=user,
            program=program,
        )
        probe = subprocess.run(
            command, capture_output=True, text=True, timeout=30, pass_fds=mounts.fds, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run here ({exc})"
    finally:
        mounts.close()
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no message"])[0]
        who = f" as uid {user[0]}" if user else ""
        return f"bubblewrap cannot create its sandbox here{who} ({reason})"
    return None


def bwrap_arguments(
    env: dict[str, str], scratch_bytes: int, mounts: Mounts, *, privileged: bool
) -> list[str]:
    """A root filesystem with the system read-only, nothing of the host's data, and one
    size-capped tmpfs at /tmp as the only writable place.

    ``privileged``: bubblewrap runs as root and keeps only what setpriv needs to become the
    sandbox user (CAP_SETUID, CAP_SETGID, CAP_SETPCAP); no user namespace, since the sandbox
    user must be a real, unprivileged user of the host."""
    args = ["bwrap", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if privileged:
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        args.append("--unshare-all")
    args.append("--clearenv")
    for name, value in env.items():
        args += ["--setenv", name, value]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            # Merged-/usr systems: keep the symlink so paths like /lib64/ld-linux resolve.
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc"]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        args += ["--ro-bind-try", path, path]
    prefix = Path(sys.base_prefix).resolve()
    if not prefix.is_relative_to("/usr"):
        # pyenv's prefix may sit under /root: its parents are made enterable in here.
        args += _parents(prefix)
        args += ["--ro-bind", str(prefix), str(prefix)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", str(SANDBOX_SCRATCH)]
    args += ["--perms", "0755", "--dir", str(SANDBOX_CODE)]
    for script in (CHILD_SCRIPT, *CHILD_MODULES):
        # Copied in, readable by anyone in here, whatever the checkout's modes and place.
        fd = mounts.open(script, os.O_RDONLY)
        args += ["--perms", "0444", "--ro-bind-data", str(fd), str(SANDBOX_CODE / script.name)]
    if seccomp.supported():
        args += ["--seccomp", str(mounts.data("frlm-seccomp", seccomp.program()))]
    # The root is a tmpfs holding the mount points; read-only, nothing can be written beside them.
    args += ["--chdir", str(SANDBOX_SCRATCH), "--remount-ro", "/"]
    return args


def _parents(path: Path) -> list[str]:
    """Directories from / down to ``path``'s parent, made 0755 (bubblewrap's default for the
    directories it creates is 0700, which the sandbox user could not enter)."""
    args: list[str] = []
    for parent in reversed(path.parents[:-1]):
        args += ["--perms", "0755", "--dir", str(parent)]
    return args
