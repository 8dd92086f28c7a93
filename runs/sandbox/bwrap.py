"""The REPL's command line: the base interpreter running child.py with an environment built
from nothing, inside bubblewrap where a probe shows bubblewrap works here."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

CHILD_SCRIPT = Path(__file__).resolve().with_name("child.py")
# The only project code the REPL sees: the child and the two stdlib-only modules it imports.
CHILD_MODULES = tuple(CHILD_SCRIPT.with_name(name) for name in ("lazytext.py", "patterns.py"))
_CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"


def repl_command(
    env: dict[str, str],
    scratch: Path,
    context: Path,
    index: Path | None,
    *,
    bwrap: bool,
    tmp_bytes: int,
) -> list[str]:
    """The command that starts child.py, wrapped in bubblewrap when ``bwrap``."""
    interpreter = base_interpreter()
    command = [str(interpreter), "-I", "-S", str(CHILD_SCRIPT)]
    if bwrap:
        prefix = bwrap_arguments(env, scratch, context, tmp_bytes, index)
        command = [*prefix, "--", *command]
    return command


def clean_env(scratch: Path) -> dict[str, str]:
    """Built from nothing: the host's environment holds API keys the REPL must not see."""
    return {
        "PATH": _CHILD_PATH,
        "LANG": "C.UTF-8",
        "HOME": str(scratch),
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


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot be used here, or None when it works."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap not installed"
    return _probe_bwrap(bwrap, str(base_interpreter()))


@functools.cache
def _probe_bwrap(bwrap: str, interpreter: str) -> str | None:
    # Containers often ship bwrap but forbid the namespaces it needs; only a real run tells.
    command = [
        bwrap,
        *("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"),
        *("--ro-bind", "/", "/", "--size", str(1 << 20), "--tmpfs", "/tmp"),
        *("--", interpreter, "-I", "-S", "-c", ""),
    ]
    try:
        probe = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run here ({exc})"
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no message"])[0]
        return f"bubblewrap cannot create its sandbox here ({reason})"
    return None


def bwrap_arguments(
    env: dict[str, str], scratch: Path, context: Path, tmp_bytes: int, index: Path | None = None
) -> list[str]:
    """A root filesystem with the system read-only, nothing of the host's data but the
    context, and the scratch directory as the only writable place besides a small /tmp."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
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
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        args += ["--ro-bind-try", path, path]
    prefix = Path(sys.base_prefix).resolve()
    if not prefix.is_relative_to("/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    # These come after /tmp so that paths under /tmp land on top of the fresh tmpfs.
    args += ["--bind", str(scratch), str(scratch)]
    args += ["--ro-bind", str(context), str(context)]
    if index is not None:
        args += ["--ro-bind", str(index), str(index)]
    for script in (CHILD_SCRIPT, *CHILD_MODULES):
        args += ["--ro-bind", str(script), str(script)]
    # The root is a tmpfs holding the mount points; read-only, nothing can be written beside them.
    args += ["--chdir", str(scratch), "--remount-ro", "/"]
    return args
