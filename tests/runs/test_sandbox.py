"""The REPL sandbox, driven through real REPL processes (bubblewrap where it is installed)."""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runs.sandbox import CellStopped, Sandbox, SandboxCallError, SandboxError, SandboxLimits

REPO = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

MakeSandbox = Callable[..., Sandbox]


def echo_handler(name: str, kwargs: dict[str, Any]) -> Any:
    return {"name": name, "kwargs": kwargs}


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[MakeSandbox]:
    """Start sandboxes over a small context file; all of them are closed after the test."""
    context = tmp_path / "context.txt"
    context.write_bytes("The quick brown fox.\nLine two: é\n".encode() + b"bad byte: \xff\n")
    started: list[Sandbox] = []

    def make(
        handler: Callable[[str, dict[str, Any]], Any] = echo_handler, **options: Any
    ) -> Sandbox:
        sandbox = Sandbox(context, handler=handler, workdir_root=tmp_path / "work", **options)
        started.append(sandbox)
        sandbox.start()
        return sandbox

    yield make
    for sandbox in started:
        sandbox.close()


def test_it_keeps_variables_between_cells(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    first = sandbox.execute("counter = 41\ndef bump(n):\n    return n + 1")
    second = sandbox.execute("print(bump(counter))")
    assert first.error is None
    assert second.stdout == "42\n"
    assert second.error is None and second.restarted is False


def test_it_exposes_the_context_as_text(make_sandbox: MakeSandbox) -> None:
    result = make_sandbox().execute("print(len(context), repr(str(context)), context[4:9])")
    # The undecodable byte becomes U+FFFD instead of failing the whole run.
    text = "The quick brown fox.\nLine two: é\nbad byte: \ufffd\n"
    assert result.stdout == f"{len(text)} {text!r} quick\n"


def test_it_reports_an_exception_and_keeps_going(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    failed = sandbox.execute("kept = 'yes'\nprint('before')\nratio = 1 / 0")
    assert failed.error == "exception"
    assert failed.stdout == "before\n"
    assert "ZeroDivisionError: division by zero" in failed.stderr
    # The model sees its own line, not the REPL's machinery.
    assert "ratio = 1 / 0" in failed.stderr
    assert "child.py" not in failed.stderr
    assert "ZeroDivisionError" in (failed.error_message or "")
    after = sandbox.execute("print(kept)")
    assert (after.stdout, after.error, after.restarted) == ("yes\n", None, False)


def test_it_reports_a_syntax_error_as_an_exception(make_sandbox: MakeSandbox) -> None:
    result = make_sandbox().execute("def broken(:\n    pass")
    assert result.error == "exception"
    assert "SyntaxError" in result.stderr
    assert "def broken(:" in result.stderr


def test_it_records_final_and_final_var(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    plain = sandbox.execute("FINAL(6 * 7)\nprint('still running')")
    by_name = sandbox.execute("answer = ['a', 'b']\nFINAL_VAR('answer')")
    by_value = sandbox.execute("FINAL_VAR(answer)")
    missing = sandbox.execute("FINAL_VAR('nothing_here')")
    none = sandbox.execute("x = 1")
    assert (plain.final, plain.stdout) == ("42", "still running\n")
    assert by_name.final == "['a', 'b']"
    assert by_value.final == "['a', 'b']"
    assert missing.error == "exception"
    assert missing.final is None
    assert "no variable named 'nothing_here'" in missing.stderr
    assert none.final is None


def test_an_answer_too_long_to_send_back_is_refused_in_its_cell(make_sandbox: MakeSandbox) -> None:
    """A 65 MB FINAL broke the protocol: the REPL was wiped, its variables lost, and the
    model told the REPL had misbehaved. It is now an error in the cell that says the limit;
    an answer at the limit, in the characters JSON escapes longest, still goes through."""
    sandbox = make_sandbox()
    sandbox.execute("kept = 'still here'")
    refused = sandbox.execute("FINAL('x' * (65 * 2**20))")
    assert refused.error == "exception", refused.error_message
    assert refused.final is None and refused.restarted is False
    assert "the answer is 65.0 MB; the limit is 8 MB" in refused.stderr
    by_name = sandbox.execute("big = 'y' * (9 * 2**20)\nFINAL_VAR('big')")
    assert "FINAL_VAR('big'): the answer is 9.0 MB" in by_name.stderr
    assert sandbox.execute("print(kept)").stdout == "still here\n"
    limit = sandbox.execute("FINAL('\\x01' * (8 * 2**20))")
    assert limit.error is None, limit.stderr
    assert limit.final == "\x01" * (8 * 2**20)


def test_it_shows_user_variables(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    sandbox.execute("import json\nitems = [1, 2, 3]\nlimit = 10\nname = 'abcd'")
    shown = sandbox.execute("SHOW_VARS()").stdout
    assert "items: list, 3 items" in shown
    assert "limit: int" in shown
    assert "name: str, 4 chars" in shown
    assert "context: str" in shown
    assert "llm_query" not in shown
    assert "json" not in shown
    assert "__builtins__" not in shown


def test_it_routes_queries_to_the_handler(make_sandbox: MakeSandbox) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def handler(name: str, kwargs: dict[str, Any]) -> Any:
        calls.append((name, kwargs))
        return f"answer from {name}"

    sandbox = make_sandbox(handler)
    result = sandbox.execute(
        "a = llm_query('What?', model='small')\n"
        "b = llm_query_batched(['one', 'two'], tier='redundant')\n"
        "c = rlm_query('Dig in', context='part of it')\n"
        "d = rlm_query('No context')\n"
        "print(a, b, c, d, sep='|')"
    )
    assert result.error is None, result.stderr
    assert result.stdout == (
        "answer from llm_query|answer from llm_query_batched|"
        "answer from rlm_query|answer from rlm_query\n"
    )
    assert calls == [
        ("llm_query", {"prompt": "What?", "model": "small"}),
        ("llm_query_batched", {"prompts": ["one", "two"], "tier": "redundant"}),
        ("rlm_query", {"prompt": "Dig in", "context": "part of it"}),
        ("rlm_query", {"prompt": "No context", "context": None}),
    ]


def test_it_returns_structured_handler_results(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(lambda name, kwargs: [p.upper() for p in kwargs["prompts"]])
    result = sandbox.execute("r = llm_query_batched(['x', 'y'])\nprint(type(r).__name__, r)")
    assert result.stdout == "list ['X', 'Y']\n"


def test_it_turns_a_sandbox_call_error_into_a_runtime_error(make_sandbox: MakeSandbox) -> None:
    def handler(name: str, kwargs: dict[str, Any]) -> Any:
        if kwargs["prompt"] == "refused":
            raise SandboxCallError("the sub-query budget is spent")
        raise KeyError("bug in the conductor")

    sandbox = make_sandbox(handler)
    refused = sandbox.execute(
        "try:\n    llm_query('refused')\nexcept RuntimeError as exc:\n    print('caught:', exc)"
    )
    internal = sandbox.execute("llm_query('anything')")
    after = sandbox.execute("print('still here')")
    assert refused.stdout == "caught: the sub-query budget is spent\n"
    assert internal.error == "exception"
    assert "RuntimeError: internal error in llm_query: KeyError" in internal.stderr
    assert after.stdout == "still here\n"


def test_it_rejects_a_batch_that_is_not_a_list_of_str(make_sandbox: MakeSandbox) -> None:
    calls: list[str] = []
    sandbox = make_sandbox(lambda name, kwargs: calls.append(name))
    not_a_list = sandbox.execute("llm_query_batched('one prompt')")
    not_str = sandbox.execute("llm_query_batched(['fine', 3])")
    assert "TypeError: llm_query_batched(prompts) needs a list of str" in not_a_list.stderr
    assert "prompts[1] is int" in not_str.stderr
    assert calls == []


def test_it_round_trips_a_4_mb_message(make_sandbox: MakeSandbox) -> None:
    def handler(name: str, kwargs: dict[str, Any]) -> Any:
        if name == "llm_query_batched":
            return [prompt[::-1] for prompt in kwargs["prompts"]]
        return kwargs["prompt"][::-1]

    sandbox = make_sandbox(handler)
    result = sandbox.execute(
        "big = 'abcé\\n' * 800_000\n"
        "back = llm_query(big)\n"
        "batch = ['xyz' * 1000 + str(i) for i in range(1400)]\n"
        "reversed_batch = llm_query_batched(batch)\n"
        "print(len(big), back == big[::-1], reversed_batch == [p[::-1] for p in batch])"
    )
    assert result.error is None, result.stderr
    assert result.stdout == "4000000 True True\n"


def test_it_reports_running_out_of_memory(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(memory_mb=256))
    sandbox.execute("small = 'still here'")
    result = sandbox.execute("huge = bytearray(512 * 1024 * 1024)")
    assert result.error == "memory"
    assert "256 MB" in (result.error_message or "")
    assert result.restarted is False
    assert sandbox.execute("print(small)").stdout == "still here\n"


def test_it_kills_a_cell_past_the_cpu_budget(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(cpu_s=1, cell_wall_s=15))
    result = sandbox.execute("lost = 1\nwhile True:\n    pass")
    assert result.error == "cpu"
    assert result.restarted is True
    assert "CPU budget" in (result.error_message or "")
    after = sandbox.execute("print('fresh', 'lost' in globals())")
    assert after.stdout == "fresh False\n"


def test_it_kills_a_cell_past_the_wall_clock(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(cell_wall_s=1))
    sandbox.execute("lost = 'soon'")
    started = time.monotonic()
    result = sandbox.execute("import time\nprint('going to sleep')\ntime.sleep(30)")
    assert time.monotonic() - started < 10
    assert result.error == "timeout"
    assert result.restarted is True
    assert result.stdout == "going to sleep\n"
    assert result.error_message == (
        "The cell ran past its 1 s wall-clock limit and was killed; the REPL was restarted "
        "and its variables were lost."
    )
    after = sandbox.execute("print('lost' in globals(), len(context))")
    assert (after.stdout, after.error) == ("False 45\n", None)


def test_a_cell_told_to_stop_is_killed_at_once_and_the_next_gets_a_fresh_repl(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(cell_wall_s=60))
    sandbox.execute("lost = 'soon'")
    asked: list[float] = []
    started = time.monotonic()

    def stop() -> bool:
        asked.append(time.monotonic())
        return time.monotonic() - started > 0.5

    with pytest.raises(CellStopped):
        sandbox.execute("import time\nwhile True:\n    time.sleep(1)", stop=stop)
    assert time.monotonic() - started < 3
    assert len(asked) >= 2  # asked while the cell ran, not only once
    after = sandbox.execute("print('lost' in globals(), len(context))")
    assert (after.stdout, after.error, after.restarted) == ("False 45\n", None, True)


def test_it_does_not_count_handler_time_against_the_wall_clock(
    make_sandbox: MakeSandbox,
) -> None:
    def slow_handler(name: str, kwargs: dict[str, Any]) -> Any:
        time.sleep(1.5)
        return "worth the wait"

    sandbox = make_sandbox(slow_handler, limits=SandboxLimits(cell_wall_s=1))
    result = sandbox.execute("print(llm_query('slow'))")
    assert result.error is None
    assert result.stdout == "worth the wait\n"
    assert result.wall_ms >= 1500


def test_it_survives_code_that_tries_to_exit(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    sandbox.execute("kept = 1")
    sys_exit = sandbox.execute("import sys\nsys.exit(3)")
    interrupt = sandbox.execute("raise KeyboardInterrupt")
    still_kept = sandbox.execute("print(kept)")
    hard_exit = sandbox.execute("import os\nos._exit(7)")
    after = sandbox.execute("print('kept' in globals())")
    assert (sys_exit.error, sys_exit.restarted) == ("exception", False)
    assert "sys.exit()" in (sys_exit.error_message or "")
    assert interrupt.error == "exception"
    assert still_kept.stdout == "1\n"
    assert (hard_exit.error, hard_exit.restarted) == ("crashed", True)
    assert "exit status 7" in (hard_exit.error_message or "")
    assert after.stdout == "False\n"


def test_it_replaces_the_repl_after_an_interrupted_execute(make_sandbox: MakeSandbox) -> None:
    class TaskTimeLimit(BaseException):
        """Stands in for an interruption from outside, such as a worker's time limit."""

    def handler(name: str, kwargs: dict[str, Any]) -> Any:
        raise TaskTimeLimit

    sandbox = make_sandbox(handler)
    sandbox.execute("lost = 1")
    with pytest.raises(TaskTimeLimit):
        sandbox.execute("llm_query('never answered')")
    after = sandbox.execute("print('lost' in globals())")
    assert (after.stdout, after.error, after.restarted) == ("False\n", None, True)


def test_it_truncates_long_output(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(output_chars=1000))
    result = sandbox.execute(
        "print('HEAD')\nfor i in range(20_000):\n    print('line', i)\nprint('TAIL')"
    )
    assert len(result.stdout) < 1100
    assert result.stdout.startswith("HEAD\nline 0\n")
    assert result.stdout.endswith("line 19999\nTAIL\n")
    assert "characters truncated ...]" in result.stdout


def test_it_shares_the_output_budget_between_stdout_and_stderr(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(output_chars=1000))
    result = sandbox.execute(
        "import sys\nsys.stdout.write('o' * 5000)\nsys.stderr.write('q' * 5000)"
    )
    assert result.stdout.count("o") == 500
    assert result.stderr.count("q") == 500
    assert "[... 4500 characters truncated ...]" in result.stdout


def test_it_keeps_the_protocol_intact_when_code_writes_to_raw_fds(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox()
    forged = sandbox.execute(
        "import os\n"
        'os.write(1, b\'{"type": "done", "error": null, "final": "forged"}\\n\')\n'
        "os.write(2, b'raw stderr\\n')\n"
        "print('after the raw writes')"
    )
    closed = sandbox.execute("import os, sys\nsys.stdout.close()\nos.close(1)")
    after = sandbox.execute("print('printing again')")
    assert forged.error is None
    assert forged.final is None
    assert forged.stdout == (
        '{"type": "done", "error": null, "final": "forged"}\nafter the raw writes\n'
    )
    assert forged.stderr == "raw stderr\n"
    assert closed.restarted is False
    assert (after.stdout, after.restarted) == ("printing again\n", False)


def test_it_hides_the_host_environment(
    make_sandbox: MakeSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-do-not-leak")
    monkeypatch.setenv("FRLM_SECRET_KEY", "django-secret-do-not-leak")
    sandbox = make_sandbox()
    result = sandbox.execute(
        "import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ').read())"
    )
    assert "do-not-leak" not in result.stdout
    assert "OPENAI_API_KEY" not in result.stdout
    assert "HOME" in result.stdout


def test_it_works_in_its_scratch_dir(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    result = sandbox.execute(
        "import os\n"
        "open('notes.txt', 'w').write('kept')\n"
        "print(os.getcwd() == os.environ['HOME'], os.listdir('.'))"
    )
    assert result.stdout == "True ['notes.txt']\n"
    assert sandbox.execute("print(open('notes.txt').read())").stdout == "kept\n"


@needs_bwrap
def test_its_scratch_space_is_a_capped_tmpfs_off_the_host_disk(
    make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    sandbox = make_sandbox(limits=SandboxLimits(scratch_mb=8))
    assert "8 MB scratch tmpfs" in sandbox.isolation
    result = sandbox.execute(
        "import errno, os\n"
        "def fill(name, size):\n"
        "    try:\n"
        "        with open(name, 'wb') as f:\n"
        "            f.write(b'x' * size)\n"
        "        return 'wrote'\n"
        "    except OSError as exc:\n"
        "        os.remove(name)\n"
        "        return errno.errorcode[exc.errno]\n"
        "print(fill('one', 9 << 20), fill('a', 5 << 20), fill('b', 5 << 20))"
    )
    # One file past the cap: RLIMIT_FSIZE; two under it that add up past it: the tmpfs full.
    assert result.stdout.split() == ["EFBIG", "wrote", "ENOSPC"]
    assert not any(path.name in ("one", "a", "b") for path in tmp_path.rglob("*"))


def test_it_limits_file_size_and_descriptors_without_isolation(
    make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    sandbox = make_sandbox(isolation="none", limits=SandboxLimits(scratch_mb=4, open_files=64))
    result = sandbox.execute(
        "import resource\n"
        "limits = (resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE)\n"
        "print(*(resource.getrlimit(limit) for limit in limits))\n"
        "handles = []\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        handles.append(open('/dev/null'))\n"
        "except OSError as exc:\n"
        "    print('descriptors', exc.errno)\n"
        "for handle in handles:\n"
        "    handle.close()\n"
        "try:\n"
        "    open('big', 'wb').write(b'x' * (5 << 20))\n"
        "except OSError as exc:\n"
        "    print('file', exc.errno)\n"
    )
    assert result.stdout.splitlines() == [
        f"({4 << 20}, {4 << 20}) (64, 64)",
        "descriptors 24",  # EMFILE
        "file 27",  # EFBIG
    ]


def test_it_removes_the_scratch_dir_on_close(make_sandbox: MakeSandbox, tmp_path: Path) -> None:
    sandbox = make_sandbox()
    sandbox.execute("open('left-behind.txt', 'w').write('x')")
    sandbox.close()
    sandbox.close()
    assert list((tmp_path / "work").iterdir()) == []
    with pytest.raises(SandboxError):
        sandbox.execute("print('too late')")


@needs_bwrap
def test_it_refuses_network_under_bwrap(make_sandbox: MakeSandbox) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        sandbox = make_sandbox(isolation="bwrap")
        result = sandbox.execute(
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('refused', type(exc).__name__)"
        )
    assert sandbox.isolation_kind == "bwrap"
    assert "no network" in sandbox.isolation
    assert result.stdout.startswith("refused")


@needs_bwrap
def test_it_hides_host_processes_under_bwrap(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(isolation="bwrap")
    result = sandbox.execute(
        "import os\nprint(len([entry for entry in os.listdir('/proc') if entry.isdigit()]))"
    )
    # bubblewrap's init and the REPL itself.
    assert int(result.stdout) <= 3


@needs_bwrap
def test_it_cannot_write_outside_the_scratch_dir_under_bwrap(
    make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    sandbox = make_sandbox(isolation="bwrap")
    # Inside, /tmp is a private tmpfs: a write there (or under a checkout that lives in
    # /tmp, as CI's may) lands in the sandbox's own memory. What matters is the host's view.
    targets = [REPO / "pwned.txt", Path("/etc/pwned.txt"), tmp_path / "pwned.txt"]
    result = sandbox.execute(
        "results = []\n"
        f"for target in {[str(target) for target in targets]!r}:\n"
        "    try:\n"
        "        open(target, 'w').write('x')\n"
        "        results.append('wrote')\n"
        "    except OSError:\n"
        "        results.append('refused')\n"
        "print(results)"
    )
    seen = eval(result.stdout)  # noqa: S307 (the list the cell printed)
    assert seen[1] == "refused"  # the read-only system
    if not REPO.is_relative_to("/tmp"):
        assert seen[0] == "refused"  # the checkout is mounted read-only
    assert not any(target.exists() for target in targets)  # nothing reached the host


def test_it_reaches_the_network_without_isolation(make_sandbox: MakeSandbox) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        sandbox = make_sandbox(isolation="none")
        result = sandbox.execute(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "print('connected')"
        )
    assert sandbox.isolation_kind == "none"
    assert sandbox.isolation.startswith("NOT ISOLATED (FRLM_SANDBOX_ISOLATION=none)")
    assert result.stdout == "connected\n"


def test_it_refuses_to_start_when_bwrap_is_required_but_missing(
    make_sandbox: MakeSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match="bubblewrap is not installed"):
        make_sandbox(isolation="bwrap")


def test_it_refuses_auto_when_bwrap_is_missing(
    make_sandbox: MakeSandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Fails closed: before issue 17, auto fell back to rlimits only and ran the cell."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError) as refused:
        make_sandbox(isolation="auto")
    message = str(refused.value)
    assert "bubblewrap is not installed" in message
    assert "apt-get install -y bubblewrap" in message
    assert "FRLM_SANDBOX_ISOLATION=none" in message
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


@needs_bwrap
def test_it_caps_the_processes_a_cell_can_start(make_sandbox: MakeSandbox) -> None:
    from runs.sandbox.pids import PIDS_MAX, PidsLimit

    probe = PidsLimit()
    if not probe.active:
        probe.remove()
        pytest.skip("no writable pids cgroup controller on this machine")
    probe.remove()
    sandbox = make_sandbox(isolation="bwrap")
    assert f"at most {PIDS_MAX} processes" in sandbox.isolation
    result = sandbox.execute(
        "import os, time\n"
        "started = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(started)"
    )
    assert result.error is None, result.stderr
    assert int(result.stdout) < PIDS_MAX  # a fork bomb stops at the cap
