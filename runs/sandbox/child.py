"""The REPL process of the sandbox: runs the root model's code cells.

Started by ``runs.sandbox.host`` as ``python -I -S child.py CONFIG_JSON``. It must only use the
standard library: under bubblewrap it sees the interpreter and this one file, nothing of the
project.

Protocol: newline-delimited JSON on two pipes that are neither fd 0, 1 nor 2, so whatever the
cell writes to stdout or stderr (even with ``os.write``) can never be mistaken for a message.

host -> child  {"type": "exec", "code": str, "cell": str}
               {"type": "fold", "text": str}  (older conversation kept in `folded`)
               {"type": "reply", "ok": bool, "result": Any, "error": str}
child -> host  {"type": "ready", "context_chars": int, "cpu_s": float}
               {"type": "call", "name": str, "kwargs": dict}
               {"type": "done", "error": None | "exception" | "memory", "exc_type": str | None,
                "exc_message": str | None, "final": str | None, "cpu_s": float,
                "cell": the exec's "cell", so a "done" forged by a thread the cell left
                running is told apart (it cannot know the next cell's random id)}
               {"type": "folded", "count": int}

`context` is a lazytext.LazyText over the context file (never read whole); lazytext.py and
patterns.py sit beside this file and are the only other code the REPL can import.
"""

from __future__ import annotations

import builtins
import json
import linecache
import os
import resource
import sys
import threading
import traceback
import types
from typing import Any

# Mirrors protocol.MAX_MESSAGE_BYTES: the host refuses anything longer, so say so here first.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# The largest answer FINAL takes, in UTF-8: its cell's "done" message stays under the limit
# above however its characters are escaped in JSON (six bytes each at worst).
FINAL_MAX_BYTES = MAX_MESSAGE_BYTES // 8
THIS_FILE = os.path.abspath(__file__)
# -I keeps the script's directory off sys.path; the two modules beside it are wanted.
sys.path.insert(0, os.path.dirname(THIS_FILE))

import lazytext  # noqa: E402
import patterns  # noqa: E402

OWN_FILES = {THIS_FILE, os.path.abspath(lazytext.__file__), os.path.abspath(patterns.__file__)}

REPL_FUNCTIONS = (
    "llm_query",
    "llm_query_batched",
    "rlm_query",
    "select_fragments",
    "FINAL",
    "FINAL_VAR",
    "SHOW_VARS",
    *patterns.PATTERNS,
)
# Private copies of the stdout/stderr pipes, to repair fd 1 and 2 if a cell closes them.
SAVED_OUTPUT_FDS: dict[int, int] = {}


class Channel:
    """The two protocol pipes, one JSON object per line."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        # Code run by the cell may start subprocesses; they must not hold our pipes open.
        os.set_inheritable(in_fd, False)
        os.set_inheritable(out_fd, False)
        self._reader = os.fdopen(in_fd, "rb", buffering=1 << 16)
        self._out_fd = out_fd
        # Threads in a cell may call llm_query together; one request/reply pair at a time.
        self.lock = threading.Lock()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._out_fd, view)
            view = view[written:]

    def receive(self) -> dict[str, Any] | None:
        line = self._reader.readline()
        if not line:
            return None
        return json.loads(line.decode("utf-8", "surrogatepass"))


def encode(message: dict[str, Any]) -> bytes:
    # ensure_ascii=False keeps non-ASCII text at its UTF-8 size; surrogatepass lets lone
    # surrogates that user code produced travel instead of failing the call.
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass") + b"\n"


class Repl:
    """The namespace the cells run in and the functions they can call."""

    def __init__(self, channel: Channel, context: lazytext.LazyText) -> None:
        self.channel = channel
        self.final: str | None = None
        self.cell_count = 0
        self.context = context
        self.namespace: dict[str, Any] = {
            "__name__": "__main__",
            "__builtins__": builtins,
            "context": context,
            "folded": [],
            "llm_query": self.llm_query,
            "llm_query_batched": self.llm_query_batched,
            "rlm_query": self.rlm_query,
            "select_fragments": self.select_fragments,
            "FINAL": self.FINAL,
            "FINAL_VAR": self.FINAL_VAR,
            "SHOW_VARS": self.SHOW_VARS,
        }
        functions = patterns.Functions(
            llm_query=self.llm_query,
            llm_query_batched=self.llm_query_batched,
            rlm_query=self.rlm_query,
            context=context,
        )
        self.namespace.update(patterns.bind(functions))

    # -- functions the cell calls ------------------------------------------------------------

    def llm_query(
        self,
        prompt: str | lazytext.Fragment,
        *,
        tier: str | None = None,
        validate: Any = None,
        model: str | None = None,
    ) -> Any:
        """Unknown keywords are a TypeError here, where they were ignored (model= from code
        written for the original RLM ran on another model than it asked for, silently)."""
        kw = given(tier=tier, validate=validate, model=model)
        prompt = as_prompt("llm_query(prompt)", prompt)
        if callable(kw.get("validate")):
            return self.checked_batch([prompt], kw)[0]
        return self.call_host("llm_query", {"prompt": prompt, **kw})

    def llm_query_batched(
        self,
        prompts: list[str | lazytext.Fragment],
        *,
        tier: str | None = None,
        validate: Any = None,
        model: str | None = None,
    ) -> Any:
        kw = given(tier=tier, validate=validate, model=model)
        if not isinstance(prompts, list | tuple):
            raise TypeError(
                f"llm_query_batched(prompts) needs a list of str, got {type(prompts).__name__}"
            )
        prompts = [
            as_prompt(f"llm_query_batched(prompts) needs a list of str, but prompts[{index}]", p)
            for index, p in enumerate(prompts)
        ]
        if callable(kw.get("validate")):
            return self.checked_batch(prompts, kw)
        return self.call_host("llm_query_batched", {"prompts": prompts, **kw})

    def checked_batch(self, prompts: list[str], kw: dict[str, Any]) -> list[str]:
        """validate=<function>: the function judges each reply here, in the REPL; a reply
        it refuses (returns falsy or raises) goes to another worker while attempts remain,
        and the new reply is judged again. What still fails comes back as a marker."""
        check = kw.pop("validate")
        sent = self.call_host("llm_query_batched", {"prompts": prompts, **kw, "check": "function"})
        handle, replies, todo = sent["handle"], sent["replies"], sent["ok"]
        while todo:
            verdicts = [[pos, *run_check(check, replies[pos])] for pos in todo]
            answer = self.call_host("objective_verdicts", {"handle": handle, "verdicts": verdicts})
            replies, todo = answer["replies"], answer["recheck"]
        return replies

    def rlm_query(
        self, prompt: str | lazytext.Fragment, context: Any = None, *, model: str | None = None
    ) -> Any:
        kw = given(model=model)
        prompt = as_prompt("rlm_query(prompt)", prompt)
        if isinstance(context, lazytext.Fragment):
            context = {"fragment": context.ref()}
        elif context is self.context:
            context = None  # the child reads the same file
        elif isinstance(context, lazytext.LazyText):
            raise TypeError("rlm_query(context=...) takes a str, a Fragment, or this context")
        return self.call_host("rlm_query", {"prompt": prompt, "context": context, **kw})

    def select_fragments(self, query: str, k: int = 8) -> list[lazytext.Fragment]:
        """The k passages of the context that best match ``query`` (BM25), best first; each
        is a Fragment with a ``score``."""
        require_str("select_fragments", "query", query)
        if not isinstance(k, int) or k < 1:
            raise ValueError("select_fragments(query, k): k must be a positive int")
        found = self.call_host("select_fragments", {"query": query, "k": k})
        fragments = []
        for item in found:
            start, end = item["chars"]
            fragment = self.context.fragment(start, end)
            fragment.score = float(item["score"])
            fragments.append(fragment)
        return fragments

    def FINAL(self, answer: Any) -> None:
        self.final = final_text("FINAL(answer)", answer)

    def FINAL_VAR(self, name: Any) -> None:
        if not isinstance(name, str):
            # The model passed the value itself instead of its name; that is what it meant.
            self.final = final_text("FINAL_VAR(name)", name)
            return
        if name not in self.namespace:
            raise NameError(
                f"FINAL_VAR({name!r}): there is no variable named {name!r}; "
                f"assign it first or call FINAL(value)"
            )
        self.final = final_text(f"FINAL_VAR({name!r})", self.namespace[name])

    def SHOW_VARS(self) -> None:
        lines = [describe(name, value) for name, value in self.user_variables()]
        print("\n".join(lines) if lines else "(no variables)")

    # -- helpers -----------------------------------------------------------------------------

    def user_variables(self) -> list[tuple[str, Any]]:
        return [
            (name, value)
            for name, value in self.namespace.items()
            if not name.startswith("_")
            and name not in REPL_FUNCTIONS
            and not (name == "folded" and value == [])
            and not isinstance(value, types.ModuleType)
        ]

    def call_host(self, name: str, kwargs: dict[str, Any]) -> Any:
        try:
            request = encode({"type": "call", "name": name, "kwargs": kwargs})
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name}: arguments must be JSON-serialisable ({exc})") from None
        if len(request) > MAX_MESSAGE_BYTES:
            raise ValueError(
                f"{name}: the request is {len(request) / 2**20:.1f} MB; the limit is "
                f"{MAX_MESSAGE_BYTES // 2**20} MB"
            )
        flush_output()
        with self.channel.lock:
            self.channel.send(request)
            reply = self.channel.receive()
        if reply is None:
            # The host went away; nothing useful can happen any more.
            os._exit(0)
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error") or f"{name} failed")
        return reply.get("result")

    def run_cell(self, code: str) -> dict[str, Any]:
        self.final = None
        self.cell_count += 1
        filename = f"<cell {self.cell_count}>"
        # Registering the source lets tracebacks show the offending line, also for functions
        # defined in earlier cells. mtime None keeps linecache.checkcache from evicting it.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        restore_streams()
        error: str | None = None
        exc_type: str | None = None
        exc_message: str | None = None
        try:
            exec(compile(code, filename, "exec"), self.namespace)  # noqa: S102 - the purpose
        except BaseException as exc:  # SystemExit and co. must not end the REPL
            error = "memory" if isinstance(exc, MemoryError) else "exception"
            exc_type = type(exc).__name__
            exc_message = safe_str(exc)[:500]
            write_traceback(exc)
            del exc
        flush_output()
        return {
            "type": "done",
            "error": error,
            "exc_type": exc_type,
            "exc_message": exc_message,
            "final": self.final,
            "cpu_s": cpu_seconds(),
        }


def given(**keywords: Any) -> dict[str, Any]:
    """The keywords a REPL function was given, to send to the host."""
    return {name: value for name, value in keywords.items() if value is not None}


def final_text(where: str, answer: Any) -> str:
    """The run's answer as text; refused here, in the cell, when it is too long to send back
    (it broke the protocol and the REPL was wiped, its variables lost)."""
    text = str(answer)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > FINAL_MAX_BYTES:
        raise ValueError(
            f"{where}: the answer is {size / 2**20:.1f} MB; the limit is "
            f"{FINAL_MAX_BYTES // 2**20} MB. Answer with a summary, or a part of it"
        )
    return text


def run_check(check: Any, reply: str) -> tuple[bool, str]:
    """A validate= function's verdict on one reply: (passed, why not)."""
    try:
        value = check(reply)
        if value:
            return True, ""
        return False, f"the check returned {safe_str(value)[:200]}"
    except Exception as exc:  # the check is the program's code: any failure is a verdict
        return False, f"the check raised {type(exc).__name__}: {safe_str(exc)[:200]}"


def as_prompt(where: str, value: Any) -> str:
    """A prompt string; a Fragment becomes its marker, which the worker fills in."""
    if isinstance(value, lazytext.Fragment):
        return value.marker
    if not isinstance(value, str):
        raise TypeError(f"{where} is {type(value).__name__} (a str or a Fragment is wanted)")
    return value


def require_str(function: str, argument: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{function}({argument}) needs a str, got {type(value).__name__}")


def safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # a user-defined __str__ may itself raise
        return f"<{type(value).__name__} whose str() failed>"


def describe(name: str, value: Any) -> str:
    kind = (
        "str (lazy, read from disk)"
        if isinstance(value, lazytext.LazyText)
        else type(value).__name__
    )
    try:
        size = len(value)
    except Exception:  # user objects may define a broken __len__
        return f"{name}: {kind}"
    unit = "chars" if isinstance(value, str | lazytext.LazyText | lazytext.Fragment) else "items"
    return f"{name}: {kind}, {size} {unit}"


def write_traceback(exc: BaseException) -> None:
    """Print the traceback without the frames of this file: the model only needs its own."""
    details = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    for current in walk_chain(details):
        kept = [frame for frame in current.stack if frame.filename not in OWN_FILES]
        current.stack = traceback.StackSummary.from_list(kept)
    try:
        sys.stderr.write("".join(details.format()))
    except Exception:  # the cell may have broken sys.stderr
        restore_streams()
        sys.stderr.write("".join(details.format()))


def walk_chain(
    details: traceback.TracebackException,
) -> list[traceback.TracebackException]:
    seen: list[traceback.TracebackException] = []
    pending = [details]
    while pending:
        current = pending.pop()
        if any(current is other for other in seen):
            continue
        seen.append(current)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return seen


def restore_streams() -> None:
    """Give the cell working stdout/stderr even if an earlier cell replaced or closed them."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if fd in SAVED_OUTPUT_FDS and not same_file(fd, SAVED_OUTPUT_FDS[fd]):
            # A cell closed fd 1 or pointed it elsewhere; put the pipe to the host back.
            os.dup2(SAVED_OUTPUT_FDS[fd], fd)
        stream = getattr(sys, f"__{name}__")
        if stream is None or stream.closed:
            # closefd=False: this object must never close the pipe behind the next one.
            stream = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            setattr(sys, f"__{name}__", stream)
        # Line buffering so that output printed before a timeout kill reaches the host.
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
        setattr(sys, name, stream)


def same_file(fd: int, other: int) -> bool:
    try:
        first, second = os.fstat(fd), os.fstat(other)
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # noqa: S110 - a cell may have closed or replaced it
            pass


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def set_limits(config: dict[str, Any]) -> None:
    """Apply the limits before any user code runs.

    The hard limits are what bind: without CAP_SYS_RESOURCE (dropped under bubblewrap) a cell
    can raise a soft limit only as far as its hard limit.
    """
    memory = config["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    # SIGXCPU at the soft limit; the hard limit (SIGKILL) catches code that ignores it.
    cpu = config["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
    # A SIGXCPU death would otherwise leave a core file of up to memory_mb in the scratch dir.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (config["nproc"], config["nproc"]))
    # No file larger than the scratch space (Python ignores SIGXFSZ: a write past it raises
    # OSError EFBIG), and a bounded number of descriptors.
    file_bytes = config["file_bytes"]
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (config["open_files"], config["open_files"]))


def close_inherited(keep: set[int]) -> None:
    """Close every descriptor but ``keep`` before any cell runs: whatever else a launcher
    left open (bubblewrap's mount sources are descriptors of host directories) must not
    reach the cell."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, already gone


def open_context(config: dict[str, Any]) -> lazytext.LazyText:
    """The context, never read whole, from the descriptor the host opened (the file's path
    names it but need not be reachable here): the conductor's offset index when it sent
    one, else one streaming pass here."""
    index = None
    if config.get("index_fd") is not None:
        with os.fdopen(config["index_fd"], encoding="utf-8") as handle:
            index = lazytext.ContextIndex(json.load(handle))
    handle = os.fdopen(config["context_fd"], "rb")
    return lazytext.LazyText(config["context_path"], index, handle=handle)


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    keep = {0, 1, 2, config["in_fd"], config["out_fd"], config["context_fd"]}
    if config.get("index_fd") is not None:
        keep.add(config["index_fd"])
    close_inherited(keep)
    channel = Channel(config["in_fd"], config["out_fd"])
    context = open_context(config)
    SAVED_OUTPUT_FDS.update({fd: os.dup(fd) for fd in (1, 2)})
    set_limits(config)
    repl = Repl(channel, context)
    restore_streams()
    context_chars = len(repl.namespace["context"])
    channel.send(encode({"type": "ready", "context_chars": context_chars, "cpu_s": cpu_seconds()}))
    while True:
        message = channel.receive()
        if message is None:
            return 0
        if message.get("type") == "exec":
            channel.send(encode({**repl.run_cell(message["code"]), "cell": message.get("cell")}))
        elif message.get("type") == "fold":
            repl.namespace.setdefault("folded", []).append(message["text"])
            channel.send(encode({"type": "folded", "count": len(repl.namespace["folded"])}))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
