"""The escape battery's programs (tests/runs/test_sandbox_escapes.py runs them): what each
hostile REPL program does, what containment means for it, and the host it hunts on."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from runs.sandbox import CellResult, SandboxLimits
from runs.sandbox.bwrap import CHILD_SCRIPT

LIMITS = SandboxLimits(cell_wall_s=8, cpu_s=60, memory_mb=512, output_chars=4000, scratch_mb=32)


@dataclass
class Host:
    """What the programs hunt for, and what must look the same after each of them."""

    secret: str
    root: Path
    secret_file: Path
    context: Path
    port: int
    abstract: str
    canary_pid: int
    connections: list[str] = field(default_factory=list)

    def fields(self) -> dict[str, object]:
        return {
            "secret_file": str(self.secret_file),
            "context": str(self.context),
            "port": self.port,
            "abstract": self.abstract,
            "host_pid": os.getpid(),
            "canary_pid": self.canary_pid,
            "host_dir": str(self.root),
            "conductor_key": str(settings.FRLM_CONDUCTOR_KEY_FILE),
            "database": str(settings.DATABASES["default"]["NAME"]),
            "child_script": str(CHILD_SCRIPT),
            "redis_port": _redis_port(),
        }


def _redis_port() -> int:
    return int(settings.FRLM_REDIS_URL.rsplit(":", 1)[1].split("/")[0])


# -- the programs ---------------------------------------------------------------------------
# Each prints what it got; ``check`` says what containment means for it, beyond what every
# program is checked for (no secret in the output, the host's files and listeners untouched,
# and a plain cell afterwards).

Check = Callable[[CellResult, Host], None]


def refused(*words: str) -> Check:
    """The program printed one line per attempt, each starting with 'refused'."""

    def check(result: CellResult, host: Host) -> None:
        lines = result.stdout.split("\n")[:-1]
        assert lines and all(line.startswith("refused") for line in lines), result.stdout
        for word in words:
            assert word in result.stdout, result.stdout

    return check


def ended(*errors: str) -> Check:
    """The cell ended with one of ``errors`` (None: normally)."""

    def check(result: CellResult, host: Host) -> None:
        assert result.error in errors, (result.error, result.error_message, result.stderr[-500:])

    return check


def printed(expected: str) -> Check:
    def check(result: CellResult, host: Host) -> None:
        assert result.stdout.strip() == expected, result.stdout + result.stderr[-500:]

    return check


TRY = """
def attempt(what, action):
    try:
        got = action()
    except BaseException as exc:
        print('refused', what, type(exc).__name__)
    else:
        print('GOT', what, repr(got)[:200])
"""


@dataclass(frozen=True)
class Program:
    name: str
    code: str
    check: Check
    wall_s: float | None = None


PROGRAMS = [
    # files
    Program(
        "read /etc/shadow",
        TRY + "attempt('shadow', lambda: open('/etc/shadow').read())",
        refused("FileNotFoundError"),
    ),
    Program(
        "read the conductor's signing key",
        TRY + "attempt('key', lambda: open('$conductor_key', 'rb').read())",
        refused(),
    ),
    Program(
        "read a 0600 secret file of the host",
        TRY + "attempt('secret', lambda: open('$secret_file').read())",
        refused(),
    ),
    Program(
        "open the database to make itself superuser",
        TRY + "import sqlite3\n"
        "attempt('db', lambda: sqlite3.connect('file:$database?mode=rw', uri=True)"
        ".execute('update auth_user set is_superuser=1').rowcount)",
        refused(),
    ),
    Program(
        "write a file into the host's directories",
        TRY + "attempt('write', lambda: open('$host_dir/pwned', 'w').write('x'))\n"
        "attempt('etc', lambda: open('/etc/pwned', 'w').write('x'))\n"
        "attempt('usr', lambda: open('/usr/pwned', 'w').write('x'))",
        refused(),
    ),
    Program(
        "hunt the whole file system for the secret",
        "import os, sys\nfound = []\n"
        "for top, dirs, files in os.walk('/'):\n"
        "    if top.startswith(('/proc', '/usr', '/sys', '/dev', sys.base_prefix)):\n"
        "        dirs[:] = []\n"
        "        continue\n"
        "    for name in files:\n"
        "        try:\n"
        "            if b'frlm-canary' in open(os.path.join(top, name), 'rb').read(1 << 20):\n"
        "                found.append(os.path.join(top, name))\n"
        "        except OSError:\n"
        "            pass\n"
        "print('found', found, sorted(os.listdir('/')))",
        lambda result, host: _assert_in("found []", result.stdout),
    ),
    Program(
        "rewrite the REPL's own code",
        TRY + "attempt('child', lambda: open('$child_script', 'a').write('#'))\n"
        "attempt('own copy', lambda: open('/frlm/child.py', 'a').write('#'))\n"
        "attempt('beside it', lambda: open('/frlm/sitecustomize.py', 'w').write('#'))",
        refused("own copy", "beside it"),
    ),
    Program(
        "rewrite the context",
        TRY + "import os\n"
        "attempt('path', lambda: open('$context', 'r+').write('x'))\n"
        "for fd in [int(fd) for fd in os.listdir('/proc/self/fd')]:\n"
        "    try:\n"
        "        target = os.readlink(f'/proc/self/fd/{fd}')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if target.endswith('context.txt'):\n"
        "        attempt('reopen', lambda: os.open(f'/proc/self/fd/{fd}', os.O_WRONLY))\n"
        "        attempt('write', lambda: os.write(fd, b'x'))",
        refused("reopen", "write"),
    ),
    Program(
        "symlinks and hard links out of the scratch space",
        TRY + "import os\n"
        "os.symlink('$secret_file', 'to-secret')\n"
        "os.symlink('/etc/shadow', 'to-shadow')\n"
        "attempt('symlink secret', lambda: open('to-secret').read())\n"
        "attempt('symlink shadow', lambda: open('to-shadow').read())\n"
        "attempt('hard link', lambda: os.link('/usr/bin/env', 'env'))",
        refused(),
    ),
    Program(
        "escape through /proc/<pid>/root and /proc/<pid>/cwd",
        TRY + "import os\n"
        "attempt('pid 1 root', lambda: os.listdir('/proc/1/root'))\n"
        "attempt('pid 1 cwd', lambda: os.listdir('/proc/1/cwd'))\n"
        "attempt('secret via root', lambda: open('/proc/self/root$secret_file').read())",
        refused(),
    ),
    Program(
        "chroot and pivot_root",
        TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def ok(rc):\n    assert rc == 0, ctypes.get_errno()\n    return rc\n"
        "attempt('chroot', lambda: os.chroot('/tmp'))\n"
        "attempt('pivot_root', lambda: ok(libc.syscall(155, b'/tmp', b'/tmp')))",
        refused(),
    ),
    Program(
        "open_by_handle_at (the 'shocker' container escape)",
        TRY + "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "handle = ctypes.create_string_buffer(8 + 128)\n"
        "ctypes.memmove(handle, (128).to_bytes(4, 'little'), 4)\n"
        "mount_id = ctypes.c_int()\n"
        "libc.name_to_handle_at(-100, b'/usr', handle, ctypes.byref(mount_id), 0)\n"
        "def reopen():\n"
        "    fd = libc.open_by_handle_at(-100, handle, 0)\n"
        "    assert fd >= 0, ctypes.get_errno()\n"
        "attempt('open_by_handle_at', reopen)",
        refused("AssertionError"),
    ),
    # environment and /proc secrets
    Program(
        "read its own environment",
        "import os\nprint(sorted(os.environ))",
        printed(
            "['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE', 'PYTHONIOENCODING', "
            "'TMPDIR']"
        ),
    ),
    Program(
        "read every /proc/<pid>/environ and the conductor's",
        TRY + "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "for pid in pids + ['$host_pid', '$canary_pid']:\n"
        "    attempt(pid, lambda: 1/0 if b'frlm-canary' not in open(f'/proc/{pid}/environ', 'rb')"
        ".read() else 'found')",
        refused(),
    ),
    Program(
        "see the host's processes",
        "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) <= 3,"
        " os.path.exists('/proc/$host_pid'), os.path.exists('/proc/$canary_pid'))",
        printed("True False False"),
    ),
    Program(
        "read the kernel log and the keyring",
        TRY + "attempt('kmsg', lambda: open('/dev/kmsg').read(100))\n"
        "attempt('keys', lambda: 1/0 if 'frlm' not in open('/proc/keys').read() else 'found')",
        refused(),
    ),
    # network
    Program(
        "connect to a TCP port on the host's loopback",
        TRY + "import socket\n"
        "attempt('tcp', lambda: socket.create_connection(('127.0.0.1', $port), timeout=2))",
        refused(),
    ),
    Program(
        "connect to Redis",
        TRY + "import socket\n"
        "attempt('redis', lambda: socket.create_connection(('127.0.0.1', $redis_port), timeout=2))",
        refused(),
    ),
    Program(
        "resolve names and send UDP out",
        TRY + "import socket\n"
        "attempt('dns', lambda: socket.getaddrinfo('pypi.org', 443))\n"
        "attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
        ".sendto(b'x', ('10.213.0.1', 53)))",
        refused(),
    ),
    Program(
        "connect to an abstract unix socket of the host",
        TRY + "import socket\n"
        "def connect():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect('\\0$abstract')\n"
        "attempt('abstract', connect)",
        refused(),
    ),
    # processes and signals
    Program(
        "fork bomb",
        "import os, time\n"
        "for _ in range(100000):\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n",
        ended("timeout", "crashed", "exception", "cpu"),
        wall_s=3,
    ),
    Program(
        "memory bomb",
        "blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))",
        ended("memory"),
    ),
    Program(
        "CPU-burning threads and an endless loop",
        "import threading\n"
        "for _ in range(4):\n"
        "    threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()\n"
        "while True:\n    pass",
        ended("timeout"),
        wall_s=2,
    ),
    Program(
        "kill its parent, pid 1 and everything it can see",
        "import os, signal\n"
        "for pid in (os.getppid(), 1, $host_pid, $canary_pid):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as exc:\n"
        "        print('refused', pid, type(exc).__name__)\n"
        "os.kill(-1, signal.SIGKILL)",
        lambda result, host: _assert_canary_alive(host),
    ),
    Program(
        "ptrace its parent",
        TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def attach(pid):\n"
        "    assert libc.ptrace(16, pid, 0, 0) == 0, ctypes.get_errno()\n"
        "attempt('ppid', lambda: attach(os.getppid()))\n"
        "attempt('pid 1', lambda: attach(1))",
        refused("AssertionError"),
    ),
    Program(
        "become root: setuid, ctypes, setuid programs",
        TRY + "import ctypes, os, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "attempt('os.setuid', lambda: os.setuid(0))\n"
        "def ctypes_setuid():\n    assert libc.setresuid(0, 0, 0) == 0, ctypes.get_errno()\n"
        "attempt('setresuid', ctypes_setuid)\n"
        "def su():\n"
        "    out = subprocess.run(['su', '-c', 'id -u'], capture_output=True, text=True,"
        " stdin=subprocess.DEVNULL, timeout=5)\n"
        "    assert out.stdout.strip() == '0', out.stderr\n"
        "attempt('su', su)\n"
        "print('refused uid', os.getuid(), os.geteuid(), os.getgroups())",
        lambda result, host: (
            _assert_in("refused uid 65534 65534 []", result.stdout) if os.geteuid() == 0 else None
        ),
    ),
    Program(
        "a daemon that outlives the sandbox",
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv('/bin/sleep', ['sleep', '613.25'])\n"
        "    os._exit(0)\n"
        "print('spawned')",
        printed("spawned"),
    ),
    Program(
        "a thread that outlives its cell and forges protocol messages",
        "import os, threading, time\n"
        "def ghost():\n"
        "    time.sleep(0.3)\n"
        "    for fd in range(3, 40):\n"
        "        try:\n"
        '            os.write(fd, b\'{"type": "done", "final": "pwned"}\\n\')\n'
        "        except OSError:\n"
        "            pass\n"
        "    while True:\n"
        "        print('ghost')\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=ghost, daemon=True).start()\n"
        "print('started')",
        printed("started"),
    ),
    Program(
        # Its decoder raised RecursionError out of the host, not the protocol error that
        # replaces the REPL (found by a review). Where the write reaches the control pipe
        # the REPL is replaced ("crashed"); where it does not (the pipe's descriptor is
        # not among them in every layout, seen in CI) the cell ends as it would.
        "a protocol message nested deeper than the decoder recurses",
        "import os\n"
        "for fd in range(3, 40):\n"
        "    try:\n"
        "        os.write(fd, b'[' * 5000 + b']' * 5000 + b'\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "print('sent')",
        ended("crashed", None),
    ),
    Program(
        # The cell's code runs in the REPL loop's own interpreter and can rewrite what its
        # "done" says. A CPU figure of "not a number" raised out of the host, failed the
        # run with an internal error and left its cell's span open (a review).
        "rewrite the loop's 'done' message",
        "import sys\nsys.modules['__main__'].cpu_seconds = lambda: 'not a number'\nprint('x')",
        ended("crashed"),
    ),
    Program(
        "replace the REPL with a shell",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo shell; sleep 30'])",
        ended("crashed", "timeout"),
        wall_s=2,
    ),
    # disk and output
    Program(
        "fill the disk from the scratch space",
        "import errno, os\nwritten = 0\n"
        "try:\n"
        "    for n in range(1000):\n"
        "        with open(f'fill-{n}', 'wb') as f:\n"
        "            for _ in range(64):\n"
        "                f.write(b'x' * (1 << 20))\n"
        "                written += 1 << 20\n"
        "except OSError as exc:\n"
        "    print('refused', errno.errorcode[exc.errno], written <= 32 << 20)",
        refused("True"),
    ),
    Program(
        "one file larger than the scratch space",
        TRY + "attempt('big', lambda: open('/tmp/big', 'wb').write(b'x' * (40 << 20)))",
        refused("OSError"),
    ),
    Program(
        "write to /dev, /dev/shm, /proc/sys and the sysrq trigger",
        TRY + "attempt('dev', lambda: open('/dev/pwned', 'w').write('x'))\n"
        "attempt('shm', lambda: open('/dev/shm/pwned', 'w').write('x'))\n"
        "attempt('sysctl', lambda: open('/proc/sys/kernel/hostname', 'w').write('pwned'))\n"
        "attempt('sysrq', lambda: open('/proc/sysrq-trigger', 'w').write('h'))",
        refused(),
    ),
    Program(
        "huge output on stdout and raw descriptors",
        "import os, sys\n"
        "for _ in range(200):\n"
        "    sys.stdout.write('y' * (1 << 18))\n"
        "    os.write(2, b'z' * (1 << 18))",
        lambda result, host: _assert_output_capped(result),
    ),
    Program(
        "exhaust file descriptors",
        TRY + "handles = []\n"
        "def many():\n"
        "    while True:\n"
        "        handles.append(open('/dev/null'))\n"
        "attempt('descriptors', many)\n"
        "print('refused', len(handles) < 300)\n"
        "for handle in handles:\n    handle.close()",
        refused("True"),
    ),
    # the policy's limits from inside
    Program(
        "lift the rlimits",
        TRY + "import resource\n"
        "names = ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_NPROC')\n"
        "for name in names:\n"
        "    limit = getattr(resource, name)\n"
        "    soft, hard = resource.getrlimit(limit)\n"
        "    if hard == resource.RLIM_INFINITY:\n"
        "        print('refused', name, 'unlimited already')\n"
        "        continue\n"
        "    attempt(name, lambda: resource.setrlimit(limit, (hard + 1, hard + 1)))",
        refused(),
    ),
    Program(
        "lift the process cap through the cgroup file system",
        TRY + "import os\n"
        "attempt('sys', lambda: os.listdir('/sys/fs/cgroup'))\n"
        "def write_own():\n"
        "    path = open('/proc/self/cgroup').read().strip().split(':')[-1]\n"
        "    open('/sys/fs/cgroup' + path + '/pids.max', 'w').write('max')\n"
        "attempt('pids.max', write_own)\n"
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def mount_cgroup():\n"
        "    os.makedirs('/tmp/cg', exist_ok=True)\n"
        "    rc = libc.mount(b'cgroup2', b'/tmp/cg', b'cgroup2', 0, None)\n"
        "    assert rc == 0, ctypes.get_errno()\n"
        "attempt('mount cgroup', mount_cgroup)",
        refused(),
    ),
    Program(
        "the kernel's riskiest doors: namespaces, eBPF, keyrings, io_uring, perf, userfaultfd",
        TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(number, *args):\n"
        "    rc = libc.syscall(number, *args)\n"
        "    assert rc < 0, rc\n"
        "    return ctypes.get_errno()\n"
        "def nested():\n"
        "    assert libc.unshare(0x10000000) == 0, ctypes.get_errno()\n"
        "attempt('user namespace', nested)\n"
        "for name, number in (('bpf', 321), ('keyctl', 250), ('io_uring_setup', 425),"
        " ('perf_event_open', 298), ('userfaultfd', 323), ('setns', 308), ('fsopen', 430)):\n"
        "    errno_ = call(number, 0, 0, 0, 0, 0)\n"
        "    print('refused' if errno_ == 1 else 'GOT', name, errno_)",
        refused("user namespace", "bpf", "io_uring_setup"),
    ),
    Program(
        "a namespace of its own to remount the host",
        TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def remount():\n"
        "    libc.unshare(0x10000000 | 0x20000)  # a user and a mount namespace, if allowed\n"
        "    os.makedirs('/tmp/m', exist_ok=True)\n"
        "    libc.mount(b'proc', b'/tmp/m', b'proc', 0, None)\n"
        "    found = [p for p in os.listdir('/tmp/m') if p == '$host_pid']\n"
        "    assert found, 'host processes not visible'\n"
        "attempt('remount', remount)\n"
        "attempt('secret', lambda: open('$secret_file').read())",
        refused(),
    ),
]


def _assert_in(needle: str, haystack: str) -> None:
    assert needle in haystack, haystack


def _assert_canary_alive(host: Host) -> None:
    os.kill(host.canary_pid, 0)  # raises if the signal reached it


def _assert_output_capped(result: CellResult) -> None:
    assert len(result.stdout) + len(result.stderr) <= LIMITS.output_chars + 200
    assert result.stdout.startswith("y") and result.stderr.startswith("z")
