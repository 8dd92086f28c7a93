"""Where a run's context comes from, checked before the run starts and made into the one
text file the REPL reads, with the offset index that lets it be read by byte ranges."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from django.conf import settings

from runs.sandbox.lazytext import ContextIndex, build_index, load_index

# Files in a context folder that are read; anything else is skipped as not text.
TEXT_SUFFIXES = {
    ".txt", ".md", ".rst", ".log", ".csv", ".tsv", ".json", ".jsonl", ".xml", ".html",
    ".htm", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".py", ".js", ".ts", ".java", ".c",
    ".h", ".cpp", ".go", ".rs", ".rb", ".sh", ".sql", ".tex", "",
}  # fmt: skip


class ContextError(ValueError):
    """The context cannot be used; the message says why and what to do."""


def looks_binary(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(8192)
    return b"\x00" in head


def check_path(raw: str) -> Path:
    """A readable, non-empty text file or a folder holding some: else ContextError."""
    if not raw or not raw.strip():
        raise ContextError("the context path is empty: give a file or a folder of text files")
    path = Path(raw).expanduser().resolve()
    if not path.exists():
        raise ContextError(f"context path {raw!r} does not exist; check the spelling")
    if not os.access(path, os.R_OK):
        raise ContextError(f"context path {raw!r} cannot be read (permission denied)")
    if path.is_dir():
        if not folder_files(path):
            raise ContextError(f"context folder {raw!r} holds no readable text files")
        return path
    if path.stat().st_size == 0:
        raise ContextError(f"context file {raw!r} is empty")
    if looks_binary(path):
        raise ContextError(f"context file {raw!r} is binary, not text; give a text file")
    return path


def folder_files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(root) / name
            if name.startswith(".") or path.suffix.lower() not in TEXT_SUFFIXES:
                continue
            if os.access(path, os.R_OK) and path.stat().st_size > 0 and not looks_binary(path):
                found.append(path)
    return found


def materialise(run_id: str, source: Path) -> tuple[Path, int]:
    """The one file the REPL reads, and its length in characters. A file is used where it
    is; a folder becomes one file with a header line before each document."""
    if source.is_file():
        return source, _char_count(source)
    target = context_dir() / f"{run_id}.txt"
    tmp = target.with_suffix(".tmp")
    chars = 0
    with open(tmp, "w", encoding="utf-8") as out:
        for path in folder_files(source):
            header = f"=== {path.relative_to(source)} ===\n"
            out.write(header)
            chars += len(header)
            with open(path, encoding="utf-8", errors="replace") as fh:
                while chunk := fh.read(1 << 20):
                    out.write(chunk)
                    chars += len(chunk)
            out.write("\n")
            chars += 1
    os.replace(tmp, target)
    return target, chars


class Encoding(TypedDict):
    invalid_bytes: int  # bytes that are not UTF-8; the REPL and workers show each as U+FFFD
    first_invalid_byte: int | None


@dataclass(frozen=True)
class PreparedContext:
    """The file the REPL reads and its offset index (one streaming pass, then cached)."""

    path: Path
    index_path: Path
    index: ContextIndex

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


def context_prepare(run_id: str, source: Path) -> PreparedContext:
    """1. a folder becomes one file (streamed), 2. the offset index is taken from the cache
    when the file is unchanged (size, mtime, inode), else built in one streaming pass and
    stored. Memory stays bounded by one read block whatever the size; bytes that are not
    UTF-8 are counted and shown as U+FFFD, never a failure halfway through a run."""
    path = materialise(run_id, source)[0] if source.is_dir() else source
    target = index_file(path)
    index = cached_index(path)
    if index is None:
        index = build_index(str(path))
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**index.to_dict(), "fingerprint": fingerprint(path)}))
        os.replace(tmp, target)
    return PreparedContext(path, target, index)


def fingerprint(path: Path) -> list[int]:
    """What says a file is unchanged without reading it: size, mtime and inode."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def index_file(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    directory = context_dir() / "index"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{key}.offsets.json"


def cached_index(path: Path) -> ContextIndex | None:
    """The stored offset index of ``path`` if the file has not changed since; else None."""
    target = index_file(path)
    try:
        data = json.loads(target.read_text())
    except (OSError, ValueError):
        return None
    if data.get("fingerprint") != fingerprint(path):
        return None
    return load_index(str(target))


def write_text(run_id: str, text: str) -> Path:
    target = context_dir() / f"{run_id}.txt"
    target.write_text(text, encoding="utf-8")
    return target


def context_dir() -> Path:
    directory = Path(settings.FRLM_CONTEXT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _char_count(path: Path) -> int:
    chars = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        while chunk := fh.read(1 << 20):
            chars += len(chunk)
    return chars
