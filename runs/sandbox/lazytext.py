"""A text file on disk that behaves like a str without ever being read whole.

Standard library only: the REPL (child.py) imports it inside the sandbox, where it sees the
interpreter, this file and the context, nothing of the project. The conductor and the
context preparation import it too, so the offset index has one definition.

The file is read as UTF-8 with each invalid byte counted as one character (Python's
surrogateescape), so character and byte offsets map exactly whatever the file holds; the
text handed out shows such a byte as U+FFFD. A sparse offset index maps a character offset
to a byte offset every INDEX_STEP bytes; a slice reads one byte range from the nearest
checkpoint before it.

What is streamed, in blocks of at most BLOCK_CHARS characters: len, slicing, iteration,
``in``, find, rfind-free counting (count), startswith/endswith, lines(), chunks(),
search() and fragments. What reads the whole text into memory: str(context) and any other
str method (upper, split, ...), which are offered for small contexts and refused with a
clear MemoryError when the text would not fit the REPL's memory limit.
"""

from __future__ import annotations

import bisect
import codecs
import hashlib
import json
import os
import re
import resource
from collections.abc import Iterator
from typing import Any, BinaryIO

INDEX_STEP = 1 << 16  # bytes between two checkpoints of the offset index
BLOCK_CHARS = 1 << 20  # characters decoded at once by the streaming operations
READ_BYTES = 1 << 20
# The marker a Fragment puts in a prompt; workers/fragments.py reads it on the worker.
MARKER_PREFIX = "<<frlm:fragment "
MARKER_SUFFIX = ">>"
# A str costs up to 4 bytes per character, plus room for what the code does with it.
_WHOLE_TEXT_FACTOR = 5
_TOKEN = re.compile(r"\w+|[^\w\s]")
_ESCAPED = re.compile("[\udc80-\udcff]")  # an invalid byte, as surrogateescape decodes it


class ContextIndex:
    """Checkpoints (char offset, byte offset) of one file, and what was learnt building them."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.path: str = data["path"]
        self.chars: int = data["chars"]
        self.bytes: int = data["bytes"]
        self.sha256: str = data["sha256"]
        self.char_marks: list[int] = data["char_marks"]
        self.byte_marks: list[int] = data["byte_marks"]
        self.invalid: int = data.get("invalid", 0)  # bytes that are not valid UTF-8
        self.first_invalid_byte: int | None = data.get("first_invalid_byte")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "chars": self.chars,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "char_marks": self.char_marks,
            "byte_marks": self.byte_marks,
            "invalid": self.invalid,
            "first_invalid_byte": self.first_invalid_byte,
        }

    def checkpoint(self, char: int) -> tuple[int, int]:
        """The last checkpoint at or before ``char``: (char offset, byte offset)."""
        at = bisect.bisect_right(self.char_marks, char) - 1
        return self.char_marks[at], self.byte_marks[at]


def build_index(path: str, handle: BinaryIO | None = None) -> ContextIndex:
    """One streaming pass: the checkpoints, the length in characters, the sha256, and how
    many bytes are not valid UTF-8 (with the offset of the first). Reads ``handle`` when
    given (from its start), else opens ``path``."""
    if handle is not None:
        handle.seek(0)
        return _index_of(path, handle)
    with open(path, "rb") as opened:
        return _index_of(path, opened)


def _index_of(path: str, handle: BinaryIO) -> ContextIndex:
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    char_marks, byte_marks = [0], [0]
    chars = consumed = invalid = 0
    first_invalid: int | None = None
    while block := handle.read(READ_BYTES):
        digest.update(block)
        for at in range(0, len(block), INDEX_STEP):
            piece = block[at : at + INDEX_STEP]
            start = byte_marks[-1]  # where the decoded text of this piece begins
            text = decoder.decode(piece)
            if not text.isascii() and (bad := _ESCAPED.search(text)) is not None:
                if first_invalid is None:
                    head = text[: bad.start()].encode("utf-8", "surrogateescape")
                    first_invalid = start + len(head)
                invalid += len(_ESCAPED.findall(text))
            consumed += len(piece)
            chars += len(text)
            char_marks.append(chars)
            byte_marks.append(consumed - len(decoder.getstate()[0]))
    tail = decoder.decode(b"", final=True)
    if tail:
        invalid += len(_ESCAPED.findall(tail))
        first_invalid = consumed - len(tail) if first_invalid is None else first_invalid
        chars += len(tail)
    if char_marks[-1] != chars or byte_marks[-1] != consumed:
        char_marks.append(chars)
        byte_marks.append(consumed)
    return ContextIndex(
        {
            "path": path,
            "chars": chars,
            "bytes": consumed,
            "sha256": digest.hexdigest(),
            "char_marks": char_marks,
            "byte_marks": byte_marks,
            "invalid": invalid,
            "first_invalid_byte": first_invalid,
        }
    )


def file_identity(stat: os.stat_result) -> list[int]:
    """Which file, unchanged, an offset index was built from: device, inode, size and
    mtime. Stored with the index (runs/engine/context.py); the REPL's host opens the
    context only if the file it opened has this identity (runs/sandbox/host.py)."""
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns]


def memory_limit_bytes() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


class Match:
    """A regex match found by LazyText.search, with offsets into the whole context."""

    __slots__ = ("_match", "_base")

    def __init__(self, match: re.Match[str], base: int) -> None:
        self._match = match
        self._base = base

    def start(self, group: int | str = 0) -> int:
        return self._base + self._match.start(group)

    def end(self, group: int | str = 0) -> int:
        return self._base + self._match.end(group)

    def span(self, group: int | str = 0) -> tuple[int, int]:
        return self.start(group), self.end(group)

    def group(self, *groups: int | str) -> Any:
        return self._match.group(*groups)

    def groups(self) -> tuple[Any, ...]:
        return self._match.groups()

    def groupdict(self) -> dict[str, Any]:
        return self._match.groupdict()

    def __getitem__(self, group: int | str) -> Any:
        return self._match[group]

    def __repr__(self) -> str:
        return f"<Match span={self.span()} match={self.group()!r}>"


class Fragment:
    """A range of the context by reference: what a sub-query carries instead of the text.

    ``header + fragment`` is a prompt holding a marker; the worker that runs the sub-query
    replaces the marker with the fragment's text, read from the file by byte range and
    checked against ``sha256``. str(fragment) and fragment.text() read it here.
    """

    __slots__ = ("_source", "path", "start", "end", "byte_start", "byte_end", "_sha256", "score")

    def __init__(
        self, source: LazyText, start: int, end: int, byte_start: int, byte_end: int
    ) -> None:
        self._source = source
        self.path = source.path
        self.start = start
        self.end = end
        self.byte_start = byte_start
        self.byte_end = byte_end
        self._sha256: str | None = None
        self.score: float | None = None  # set by select_fragments and tree_search

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.raw()).hexdigest()
        return self._sha256

    def raw(self) -> bytes:
        return self._source.read_bytes(self.byte_start, self.byte_end)

    def text(self) -> str:
        return self.raw().decode("utf-8", errors="replace")

    def ref(self) -> dict[str, Any]:
        """The reference as JSON: path, char and byte offsets, sha256 of the bytes."""
        return {
            "path": self.path,
            "chars": [self.start, self.end],
            "bytes": [self.byte_start, self.byte_end],
            "sha256": self.sha256,
        }

    @property
    def marker(self) -> str:
        return MARKER_PREFIX + json.dumps(self.ref(), separators=(",", ":")) + MARKER_SUFFIX

    def __len__(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return self.text()

    def __add__(self, other: Any) -> str:
        if isinstance(other, str):
            return self.marker + other
        return NotImplemented

    def __radd__(self, other: Any) -> str:
        if isinstance(other, str):
            return other + self.marker
        return NotImplemented

    def __contains__(self, sub: str) -> bool:
        return sub in self.text()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fragment):
            return NotImplemented
        return (other.path, other.byte_start, other.byte_end) == (
            self.path,
            self.byte_start,
            self.byte_end,
        )

    def __hash__(self) -> int:
        return hash((self.path, self.byte_start, self.byte_end))

    def __repr__(self) -> str:
        return f"<Fragment chars {self.start}:{self.end} of {os.path.basename(self.path)}>"


class LazyText:
    """The context: a UTF-8 file read by byte ranges, offered with the interface of a str."""

    def __init__(
        self, path: str, index: ContextIndex | None = None, handle: BinaryIO | None = None
    ) -> None:
        self.path = path
        # Held for the life of the REPL; the REPL gets it as a descriptor from the host.
        self._handle = handle if handle is not None else open(path, "rb")  # noqa: SIM115
        self.index = index if index is not None else build_index(path, self._handle)

    # -- reading -------------------------------------------------------------------------

    def read_bytes(self, start: int, end: int) -> bytes:
        self._handle.seek(start)
        return self._handle.read(max(0, end - start))

    def byte_offset(self, char: int) -> int:
        """The byte offset where character ``char`` starts (0 <= char <= len)."""
        char = min(max(0, char), self.index.chars)
        mark_char, mark_byte = self.index.checkpoint(char)
        if mark_char == char:
            return mark_byte
        text = self._decode_from(mark_byte, char - mark_char)
        return mark_byte + len(text.encode("utf-8", "surrogateescape"))

    def read(self, start: int, end: int) -> str:
        """Characters [start, end) of the context."""
        start = min(max(0, start), self.index.chars)
        end = min(max(start, end), self.index.chars)
        if start == end:
            return ""
        first = self.byte_offset(start)
        mark_char, mark_byte = self.index.checkpoint(end)
        if mark_char <= start:
            text = self._decode_from(first, end - start)
        else:
            # Whole checkpoints are one byte range; only the tail past the last is counted.
            head = self.read_bytes(first, mark_byte).decode("utf-8", "surrogateescape")
            text = head + self._decode_from(mark_byte, end - mark_char)
        return _ESCAPED.sub("\ufffd", text) if self.index.invalid else text

    def _decode_from(self, byte: int, count: int) -> str:
        """``count`` characters starting at byte offset ``byte`` (a character start)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        parts: list[str] = []
        have = 0
        self._handle.seek(byte)
        while have < count:
            # At most 4 bytes per character: never read more than the rest can need.
            block = self._handle.read(min(READ_BYTES, (count - have) * 4))
            if not block:
                parts.append(decoder.decode(b"", final=True))
                break
            text = decoder.decode(block)
            parts.append(text[: count - have])
            have += len(parts[-1])
        return "".join(parts)[:count]

    def blocks(
        self, start: int = 0, end: int | None = None, size: int = BLOCK_CHARS
    ) -> Iterator[tuple[int, str]]:
        """(offset, text) of consecutive blocks covering [start, end)."""
        end = self.index.chars if end is None else min(end, self.index.chars)
        at = max(0, start)
        while at < end:
            stop = min(end, at + size)
            yield at, self.read(at, stop)
            at = stop

    # -- str-like interface --------------------------------------------------------------

    def __len__(self) -> int:
        return self.index.chars

    def __getitem__(self, key: int | slice) -> str:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.index.chars)
            if step == 1:
                return self.read(start, stop)
            if step > 0:
                return self.read(start, stop)[::step]
            return self.read(stop + 1, start + 1)[::-1][::-step]
        if not isinstance(key, int):
            raise TypeError(f"context indices must be integers or slices, not {type(key).__name__}")
        if key < 0:
            key += self.index.chars
        if not 0 <= key < self.index.chars:
            raise IndexError("context index out of range")
        return self.read(key, key + 1)

    def __iter__(self) -> Iterator[str]:
        for _offset, block in self.blocks():
            yield from block

    def __contains__(self, sub: object) -> bool:
        if not isinstance(sub, str):
            raise TypeError(
                f"'in <context>' requires str as left operand, not {type(sub).__name__}"
            )
        return self.find(sub) != -1

    def find(self, sub: str, start: int | None = None, end: int | None = None) -> int:
        """Like str.find, streamed: blocks overlap by len(sub) - 1 so no match is cut."""
        start, end = self._bounds(start, end)
        if not sub:
            return start if start <= end else -1
        overlap = len(sub) - 1
        at = start
        size = 4096  # a near match costs a small read; blocks grow for a far one
        while at < end:
            stop = min(end, at + size)
            text = self.read(at, min(end, stop + overlap))
            found = text.find(sub)
            if found != -1 and at + found < stop:
                return at + found
            at = stop
            size = min(BLOCK_CHARS, size * 4)
        return -1

    def index(self, sub: str, start: int | None = None, end: int | None = None) -> int:
        found = self.find(sub, start, end)
        if found == -1:
            raise ValueError("substring not found")
        return found

    def rfind(self, sub: str, start: int | None = None, end: int | None = None) -> int:
        """Like str.rfind, streamed from the end."""
        start, end = self._bounds(start, end)
        if not sub:
            return end
        overlap = len(sub) - 1
        stop = end
        while stop > start:
            at = max(start, stop - BLOCK_CHARS)
            text = self.read(at, min(end, stop + overlap))
            found = text.rfind(sub)
            if found != -1 and at + found < stop:
                return at + found
            stop = at
        return -1

    def count(self, sub: str, start: int | None = None, end: int | None = None) -> int:
        """Like str.count (non-overlapping), streamed."""
        start, end = self._bounds(start, end)
        if not sub:
            return end - start + 1
        total = 0
        at = self.find(sub, start, end)
        while at != -1:
            total += 1
            at = self.find(sub, at + len(sub), end)
        return total

    def startswith(self, prefix: str | tuple[str, ...]) -> bool:
        prefixes = (prefix,) if isinstance(prefix, str) else prefix
        return any(self.read(0, len(p)) == p for p in prefixes)

    def endswith(self, suffix: str | tuple[str, ...]) -> bool:
        suffixes = (suffix,) if isinstance(suffix, str) else suffix
        n = self.index.chars
        return any(self.read(n - len(s), n) == s for s in suffixes if len(s) <= n)

    def __str__(self) -> str:
        self._check_fits("str(context)")
        return self.read(0, self.index.chars)

    def __add__(self, other: Any) -> str:
        if isinstance(other, str):
            return str(self) + other
        return NotImplemented

    def __radd__(self, other: Any) -> str:
        if isinstance(other, str):
            return other + str(self)
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyText):
            return self.index.sha256 == other.index.sha256
        if isinstance(other, str):
            return len(other) == self.index.chars and str(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self.index.chars > 0

    def __repr__(self) -> str:
        return (
            f"<context: {self.index.chars:,} characters ({self.index.bytes:,} bytes of UTF-8) "
            f"read lazily from {os.path.basename(self.path)}>"
        )

    def __getattr__(self, name: str) -> Any:
        # Any other str method works on the whole text, for contexts small enough to hold.
        if name.startswith("_") or not hasattr(str, name):
            raise AttributeError(f"the context has no attribute {name!r}")
        self._check_fits(f"context.{name}()")
        return getattr(self.read(0, self.index.chars), name)

    def _check_fits(self, what: str) -> None:
        limit = memory_limit_bytes()
        if limit is None or self.index.bytes * _WHOLE_TEXT_FACTOR < limit:
            return
        raise MemoryError(
            f"{what} would read the whole context ({self.index.bytes / 2**20:,.0f} MB) into "
            f"memory, more than the REPL's {limit / 2**20:,.0f} MB allow; use slices "
            f"(context[a:b]), context.chunks(...), context.lines(), context.search(...) or "
            f"context.find(...), which read the file piece by piece"
        )

    def _bounds(self, start: int | None, end: int | None) -> tuple[int, int]:
        n = self.index.chars
        start = 0 if start is None else (start + n if start < 0 else start)
        end = n if end is None else (end + n if end < 0 else end)
        return max(0, min(start, n)), max(0, min(end, n))

    # -- streaming helpers ---------------------------------------------------------------

    def lines(self, keepends: bool = False) -> Iterator[str]:
        """The lines of the context, one at a time."""
        rest = ""
        for _offset, block in self.blocks():
            parts = (rest + block).splitlines(True)
            rest = parts.pop() if parts and not parts[-1].endswith(("\n", "\r")) else ""
            for line in parts:
                yield line if keepends else line.rstrip("\r\n")
        if rest:
            yield rest

    def search(
        self, pattern: str | re.Pattern[str], flags: int = 0, *, max_match: int = 4096
    ) -> Iterator[Match]:
        """re.finditer over the whole context, streamed. Blocks overlap by ``max_match``
        characters: a match longer than that may be cut or missed."""
        regex = re.compile(pattern, flags) if isinstance(pattern, str) else pattern
        at = 0
        n = self.index.chars
        while at < n:
            stop = min(n, at + BLOCK_CHARS)
            reach = min(n, stop + max_match)
            text = self.read(at, reach)
            last_end = 0
            for match in regex.finditer(text):
                if at + match.start() >= stop and reach < n:
                    break
                last_end = match.end()
                yield Match(match, at)
            # The next block starts after the last match that reached into the overlap.
            at = max(stop, at + last_end) if reach < n else n

    def findall(self, pattern: str | re.Pattern[str], flags: int = 0) -> list[Any]:
        return [m.group() if not m.groups() else _groups(m) for m in self.search(pattern, flags)]

    def fragment(self, start: int, end: int) -> Fragment:
        start, end = self._bounds(start, end)
        end = max(start, end)
        return Fragment(self, start, end, self.byte_offset(start), self.byte_offset(end))

    def chunks(
        self, size: int = 100_000, overlap: int = 0, by: str = "chars", snap: str | None = None
    ) -> list[Fragment]:
        """The context cut into Fragments of ``size`` characters, lines or tokens (a token
        is a word or a punctuation mark), each overlapping the previous by ``overlap`` of
        the same unit. With ``snap`` (by characters, no overlap) each cut moves forward to
        just after the next ``snap``, e.g. "\n" to keep lines whole. Only offsets are
        kept: the text is read when a fragment is used."""
        if self.index.chars == 0:
            return []
        if snap:
            if by != "chars" or overlap:
                raise ValueError("chunks(snap=...) works by characters without overlap")
            return self._snapped(size, snap)
        if size < 1:
            raise ValueError("chunks(size) must be at least 1")
        if not 0 <= overlap < size:
            raise ValueError("chunks(overlap) must be at least 0 and less than size")
        if by == "chars":
            n = self.index.chars
            bounds = []
            for start in range(0, max(1, n), size - overlap):
                bounds.append((start, min(n, start + size)))
                if start + size >= n:
                    break
        elif by in ("lines", "tokens"):
            bounds = self._unit_chunks(
                _line_starts if by == "lines" else _token_starts, size, overlap
            )
        else:
            raise ValueError(f"chunks(by={by!r}): by is 'chars', 'lines' or 'tokens'")
        return [self.fragment(s, e) for s, e in bounds]

    def _snapped(self, size: int, snap: str) -> list[Fragment]:
        n = self.index.chars
        cuts = [0]
        while cuts[-1] + size < n:
            found = self.find(snap, cuts[-1] + size)
            if found == -1:
                break
            cuts.append(found + len(snap))
        if cuts[-1] < n or len(cuts) == 1:
            cuts.append(n)
        return [self.fragment(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a] or [
            self.fragment(0, 0)
        ]

    def _unit_chunks(self, starts_of: Any, size: int, overlap: int) -> list[tuple[int, int]]:
        """Windows of ``size`` units stepping by size - overlap, from the units' offsets.
        Only one offset per unit is kept, as a compact array of ints."""
        from array import array

        offsets = array("q")
        n = self.index.chars
        for at, block in self.blocks():
            offsets.extend(at + s for s in starts_of(block, at == 0) if at + s < n)
        if not offsets:
            return [(0, n)]
        bounds: list[tuple[int, int]] = []
        step = size - overlap
        for first in range(0, len(offsets), step):
            last = first + size
            bounds.append(
                (offsets[first] if first else 0, offsets[last] if last < len(offsets) else n)
            )
            if last >= len(offsets):
                break
        return bounds


def _groups(match: Match) -> Any:
    groups = match.groups()
    return groups[0] if len(groups) == 1 else groups


def _line_starts(block: str, first: bool) -> Iterator[int]:
    # A block boundary may fall inside a line: only a "\n" opens a new one, so a line
    # cut in two is still counted once.
    if first:
        yield 0
    for match in re.finditer("\n", block):
        yield match.end()


def _token_starts(block: str, first: bool) -> Iterator[int]:
    # A token cut by a block boundary is counted twice at worst; sizes are approximate.
    for match in _TOKEN.finditer(block):
        yield match.start()
