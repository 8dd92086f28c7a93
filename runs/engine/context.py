"""Where a run's context comes from, checked before the run starts and made into the one
text file the REPL reads, with the offset index that lets it be read by byte ranges."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO, TypedDict

from django.conf import settings

from runs.sandbox.lazytext import ContextIndex, build_index, file_identity

# Files in a context folder that are read; anything else is skipped as not text.
TEXT_SUFFIXES = {
    ".txt", ".md", ".rst", ".log", ".csv", ".tsv", ".json", ".jsonl", ".xml", ".html",
    ".htm", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".py", ".js", ".ts", ".java", ".c",
    ".h", ".cpp", ".go", ".rs", ".rb", ".sh", ".sql", ".tex", "",
}  # fmt: skip


class ContextError(ValueError):
    """The context cannot be used; the message says why and what to do."""


# The product's copy of a run's context in the store (runs.models.new_run_id), being written.
RUN_COPY = re.compile(r"r[0-9a-f]{12}\.(txt|tmp)")
BINARY_PROBE = 8192  # bytes looked at for a NUL: what makes a file binary to FRLM


def binary_head(data: bytes) -> bool:
    """Whether bytes that begin a file make it binary (a NUL in the first BINARY_PROBE):
    the one rule for a file on disk and an upload (runs/forms.py)."""
    return b"\x00" in data[:BINARY_PROBE]


def looks_binary(path: Path) -> bool:
    with open(path, "rb") as fh:
        return binary_head(fh.read(BINARY_PROBE))


class StoreRoots(list[Path]):
    """The context store as the one root, for a file the product wrote itself: only these
    roots may read its copies of runs' contexts (stored_copy)."""


def context_roots(*, written_here: bool = False) -> list[Path]:
    """The folders a context may be read from, resolved: FRLM_CONTEXT_ROOTS for a path a
    user gave; the context store for a file the product wrote itself (an upload, a
    generated task), whatever the roots are."""
    if written_here:
        return StoreRoots([_real(settings.FRLM_CONTEXT_DIR)])
    return [_real(root) for root in settings.FRLM_CONTEXT_ROOTS]


def stored_copy(path: Path) -> bool:
    """Whether the resolved ``path`` is one of the product's copies of a run's context in the
    store (`<run id>.txt`, being written `.tmp`) or their offset indexes. The store is the
    default root too: a staff user's "path on the server" of the store read every user's
    uploads, and wrote itself a copy of them for the next one to read twice (a review)."""
    store = _real(settings.FRLM_CONTEXT_DIR)
    if path.is_relative_to(store / "index"):
        return True
    return path.parent == store and RUN_COPY.fullmatch(path.name) is not None


def server_files() -> list[Path]:
    """The server's own files and folders, resolved: never a context, even under a root an
    operator configured (a root may well be the data directory)."""
    data = Path(settings.DATA_DIR)
    database = settings.DATABASES["default"]
    found = [
        settings.FRLM_CONDUCTOR_KEY_FILE,
        data / "keys",
        data / "workers",  # the venue workers' keys (workers.runtime.default_key_file)
        data / "stack",  # the Redis ACL file, pids and logs
        data / "secret_key",  # SECRET_KEY when the environment gives none (frlm_web.secret)
        settings.FRLM_SANDBOX_DIR,
        settings.FRLM_TRACE_DIR,  # every run's prompts and replies
    ]
    for name in {str(database["NAME"]), str(database.get("TEST", {}).get("NAME") or "")} - {""}:
        found += [Path(name + suffix) for suffix in ("", "-wal", "-shm", "-journal")]
    return [_real(path) for path in found]


def check_place(path: Path, raw: str, roots: Sequence[Path]) -> None:
    """ContextError unless the resolved ``path`` lies under one of ``roots`` and is none of
    the server's own files (checked first: a key under a root is still a key)."""
    where = _roots_text(roots)
    if stored_copy(path) and not isinstance(roots, StoreRoots):
        raise ContextError(
            f"context path {raw!r} is FRLM's own copy of a run's context (or its index), "
            "which holds what another user gave; give the original file, or replay that run "
            "(manage.py frlm_replay RUN_ID)"
        )
    if path.suffix == ".key" or any(
        path == own or path.is_relative_to(own) or own.is_relative_to(path)
        for own in server_files()
    ):
        raise ContextError(
            f"context path {raw!r} is or holds one of the server's own files (its database, "
            "keys, sandbox or process state), which are never read as a context; give a "
            f"file under {where}, or upload it instead"
        )
    if not any(path.is_relative_to(root) for root in roots):
        raise ContextError(
            f"context path {raw!r} is outside the folders contexts may be read from "
            f"({where}); move the file under one of them, have the operator add its folder "
            f"to FRLM_CONTEXT_ROOTS (folders separated by {os.pathsep!r}), or upload it instead"
        )


def check_path(raw: str, roots: Sequence[Path] | None = None) -> Path:
    """A readable, non-empty text file or a folder holding some, under one of ``roots``
    (FRLM_CONTEXT_ROOTS unless given), resolved: else ContextError. Its place is checked
    before it is looked at, so nothing is told about files outside the roots."""
    if not raw or not raw.strip():
        raise ContextError("the context path is empty: give a file or a folder of text files")
    roots = context_roots() if roots is None else roots
    path = _real(Path(raw).expanduser())
    check_place(path, raw, roots)
    if not path.exists():
        raise ContextError(f"context path {raw!r} does not exist; check the spelling")
    if not os.access(path, os.R_OK):
        raise ContextError(f"context path {raw!r} cannot be read (permission denied)")
    if path.is_dir():
        if not folder_files(path, roots):
            raise ContextError(f"context folder {raw!r} holds no readable text files")
        return path
    if not path.is_file():
        raise ContextError(f"context path {raw!r} is not a regular file or a folder")
    if path.stat().st_size == 0:
        raise ContextError(f"context file {raw!r} is empty")
    if looks_binary(path):
        raise ContextError(f"context file {raw!r} is binary, not text; give a text file")
    return path


def open_checked(path: Path, roots: Sequence[Path]) -> BinaryIO:
    """The file at ``path`` open for reading, checked as opened: what the descriptor holds
    must be a regular file in an allowed place. The path was checked before, but it may
    have been swapped since (for a symlink to a key, say); this is what the conductor reads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ContextError(
            f"context file {path} cannot be opened ({exc.strerror}); if it was replaced by "
            "a symbolic link since the run was checked, give the real file"
        ) from exc
    handle = os.fdopen(fd, "rb")
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            raise ContextError(f"context file {path} is no longer a regular file")
        check_place(_opened_path(fd, path, stat), str(path), roots)
    except BaseException:
        handle.close()
        raise
    return handle


def _opened_path(fd: int, path: Path, stat: os.stat_result) -> Path:
    """Where the open file really is: the kernel says (Linux); elsewhere the path, resolved
    now, must still lead to the very file that was opened."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        real = _real(path)
        now = real.stat()
        if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino):
            raise ContextError(f"context file {path} changed while it was opened") from None
        return real


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def _roots_text(roots: Sequence[Path]) -> str:
    if not roots:
        return "none: FRLM_CONTEXT_ROOTS is empty"
    return os.pathsep.join(str(root) for root in roots)


@dataclass(frozen=True)
class FolderScan:
    """A context folder's text files, in order, and what was left out of it and why (each
    `(path in the folder, reason)`): a folder run dropped files without a word, the one
    holding the answer among them (a review)."""

    files: list[Path]
    left_out: list[tuple[str, str]]  # the first LEFT_OUT_KEPT
    left_out_count: int = 0
    hidden: int = 0  # hidden files and folders (".env", ".git"): counted, never named

    def note(self, shown: int = 6) -> str:
        """The files left out, in one line a user can act on ("" when none)."""
        if not self.left_out_count and not self.hidden:
            return ""
        parts = []
        if self.left_out_count:
            items = ", ".join(f"{path} ({why})" for path, why in self.left_out[:shown])
            more = self.left_out_count - min(shown, len(self.left_out))
            parts.append(f"{self.left_out_count} left out: {items}")
            if more > 0:
                parts[-1] += f" and {more} more"
        if self.hidden:
            parts.append(f"{self.hidden} hidden file(s) or folder(s) left out")
        return f"{len(self.files)} file(s) joined; " + "; ".join(parts)


LEFT_OUT_KEPT = 200  # entries a scan names; a folder of a million others is counted


def folder_files(folder: Path, roots: Sequence[Path]) -> list[Path]:
    return scan_folder(folder, roots).files


def scan_folder(folder: Path, roots: Sequence[Path]) -> FolderScan:
    """The text files of ``folder`` and what is left out (hidden, not a text file's name,
    empty, unreadable, binary, a link to a folder); ContextError for one that leads out of
    the roots or to the server's own files (a symlink), rather than leaving it out unsaid."""
    found: list[Path] = []
    left_out: list[tuple[str, str]] = []
    counts = {"out": 0, "hidden": 0}
    skip_copies = not isinstance(roots, StoreRoots)  # a user's folder: not the store's copies

    def out(path: Path | str, why: str) -> None:
        counts["out"] += 1
        if len(left_out) < LEFT_OUT_KEPT:
            name = str(Path(path).relative_to(folder)).encode("utf-8", "surrogateescape")
            left_out.append((name.decode("utf-8", "replace"), why))  # a name not UTF-8

    def unreadable(error: OSError) -> None:
        if error.filename and os.fspath(error.filename) != os.fspath(folder):
            out(error.filename, "a folder that cannot be read")

    for root, dirs, files in os.walk(folder, onerror=unreadable):
        for name in sorted(dirs):
            path = Path(root) / name
            if name.startswith("."):
                counts["hidden"] += 1
            elif path.is_symlink():  # os.walk does not follow one
                out(path, "a link to a folder, not followed")
            elif skip_copies and stored_copy(_real(path)):
                out(path, "FRLM's offset indexes of stored contexts")
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and not (skip_copies and stored_copy(_real(Path(root) / d)))
        )
        for name in sorted(files):
            path = Path(root) / name
            if name.startswith("."):
                counts["hidden"] += 1
                continue
            if path.suffix.lower() not in TEXT_SUFFIXES:
                out(path, f"not a text file's name ({path.suffix or 'no suffix'})")
                continue
            if skip_copies and stored_copy(_real(path)):
                out(path, "FRLM's own copy of a run's context")
                continue
            check_place(_real(path), str(path), roots)
            if not path.is_file():
                out(path, "not a regular file")
            elif not os.access(path, os.R_OK):
                out(path, "cannot be read")
            elif path.stat().st_size == 0:
                out(path, "empty")
            elif looks_binary(path):
                out(path, "binary: it holds NUL bytes")
            else:
                found.append(path)
    return FolderScan(found, left_out, counts["out"], counts["hidden"])


def materialise(run_id: str, source: Path, roots: Sequence[Path]) -> tuple[Path, FolderScan]:
    """A folder as the one file the REPL reads, a header line before each document, each
    read through a descriptor checked as opened (open_checked) and copied byte for byte:
    bytes that are not UTF-8 are counted in the joined file as in a file given alone (a
    decode with U+FFFD here hid them; a review)."""
    target = context_dir() / f"{run_id}.txt"
    tmp = target.with_suffix(".tmp")
    scan = scan_folder(source, roots)
    with open(tmp, "wb") as out:
        for path in scan.files:
            header = f"=== {path.relative_to(source)} ===\n"
            out.write(header.encode("utf-8", "surrogateescape"))
            with open_checked(_real(path), roots) as raw:
                shutil.copyfileobj(raw, out, 1 << 20)
            out.write(b"\n")
    os.replace(tmp, target)
    return target, scan


class Encoding(TypedDict):
    invalid_bytes: int  # bytes that are not UTF-8; the REPL and workers show each as U+FFFD
    first_invalid_byte: int | None


@dataclass(frozen=True)
class PreparedContext:
    """The file the REPL reads and its offset index (one streaming pass, then cached)."""

    path: Path
    index_path: Path
    index: ContextIndex
    folder: FolderScan | None = None  # what a folder context joined and left out

    @property
    def chars(self) -> int:
        return self.index.chars

    @property
    def sha256(self) -> str:
        return self.index.sha256

    @property
    def encoding(self) -> Encoding | None:
        """How much of the file is not UTF-8, if any: handled, and said in the trace."""
        if not self.index.invalid:
            return None
        return {
            "invalid_bytes": self.index.invalid,
            "first_invalid_byte": self.index.first_invalid_byte,
        }


def context_prepare(
    run_id: str, source: Path, roots: Sequence[Path] | None = None
) -> PreparedContext:
    """1. a folder becomes one file (streamed), 2. the file is opened and checked as opened
    (open_checked: a path swapped after it was checked fails here), 3. the offset index of
    what was opened is taken from the cache when the file is unchanged (its identity), else
    built in one streaming pass and stored. The index records that identity, and the REPL's
    host opens only that file (runs/sandbox/host.py). Memory stays bounded by one read block
    whatever the size; bytes that are not UTF-8 are counted and shown as U+FFFD, never a
    failure halfway through a run."""
    roots = context_roots() if roots is None else roots
    folder = None
    if source.is_dir():
        source, folder = materialise(run_id, source, roots)
        roots = context_roots(written_here=True)
    with open_checked(source, roots) as handle:
        identity = file_identity(os.fstat(handle.fileno()))
        target = index_file(source)
        index = cached_index(target, identity)
        if index is None:
            index = build_index(str(source), handle)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({**index.to_dict(), "fingerprint": identity}))
            os.replace(tmp, target)
    return PreparedContext(source, target, index, folder)


def index_file(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    directory = context_dir() / "index"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{key}.offsets.json"


def cached_index(target: Path, identity: list[int]) -> ContextIndex | None:
    """The offset index stored at ``target`` if it was built from the file of this
    identity, unchanged since; else None."""
    try:
        data = json.loads(target.read_text())
    except (OSError, ValueError):
        return None
    if data.get("fingerprint") != identity:
        return None
    return ContextIndex(data)


def write_text(run_id: str, text: str) -> Path:
    target = context_dir() / f"{run_id}.txt"
    target.write_text(text, encoding="utf-8")
    return target


def context_dir() -> Path:
    directory = Path(settings.FRLM_CONTEXT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory
