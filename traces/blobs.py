"""Content-addressed blob store: prompts and replies stored once, by sha256.

Blobs live in append-only pack files (`blobs/packs/pack-<ns>-<pid>.pack`), each with an index
(`.idx`) of fixed records: the raw sha256, the offset and the length of the text. One file per
blob cost the recorder ~60 us a payload (a create, a write and a rename each); a pack takes a
batch's payloads in one write and one fsync.

Writing: only the recorder writes, through a `PackWriter`. Per batch it appends the texts,
syncs them, then appends their index records and syncs those: an index record that a reader
can see always points at complete text. A recorder opens a new pack at each start, so a pack
left by a killed recorder is never appended to again; a record torn by the kill (a partial
last record) is ignored by readers and its text stored again when the event is replayed.

Reading: any process, through `blob_get`. Each process keeps an index of every pack in
memory and reads only what has been appended to an index file since its last look, when a
ref is not found. Blobs of data directories from before packs (one file each, `blobs/ab/
abcd...`) are still read from their files, and `traces.prune` still removes them.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

RECORD = struct.Struct("<32sQI")  # sha256, offset, length
REF = re.compile(r"^[0-9a-f]{64}\Z")
ROTATE_BYTES = 256 * 1024 * 1024  # a new pack past this, so prune can compact old ones


def blob_dir() -> Path:
    return settings.FRLM_TRACE_DIR / "blobs"


def pack_dir() -> Path:
    return blob_dir() / "packs"


def blob_path(ref: str) -> Path:
    """Where a blob of the one-file-per-blob layout (before packs) is."""
    return blob_dir() / ref[:2] / ref


def is_ref(ref: object) -> bool:
    return isinstance(ref, str) and REF.match(ref) is not None


def pack_name(created_ns: int, pid: int, generation: int = 0) -> str:
    """Names sort by creation (fixed-width time), so the newest pack is the last name; a
    compacted pack keeps its original's place with a `~generation` suffix."""
    suffix = f"~{generation}" if generation else ""
    return f"pack-{created_ns:020d}-{pid}{suffix}"


def pack_stems() -> list[str]:
    """Stems of the packs whose index exists, oldest first."""
    try:
        names = os.listdir(pack_dir())
    except FileNotFoundError:
        return []
    return sorted(n[:-4] for n in names if n.endswith(".idx") and not n.startswith("."))


def read_records(idx: Path, offset: int = 0) -> tuple[list[tuple[bytes, int, int]], int]:
    """An index file's whole records from byte `offset`; returns them and the offset after
    the last whole one (a torn last record is left for a later look, or forever)."""
    with open(idx, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    whole = len(data) - len(data) % RECORD.size
    return list(RECORD.iter_unpack(data[:whole])), offset + whole


@dataclass
class _Pack:
    read_to: int = 0  # bytes of its index already read
    refs: dict[bytes, tuple[int, int]] = field(default_factory=dict)


class PackIndex:
    """Where each blob is: every pack's index, read incrementally."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._packs: dict[str, _Pack] = {}
        self._where: dict[bytes, tuple[str, int, int]] = {}
        self._root: Path | None = None

    def refresh(self) -> None:
        with self._lock:
            root = pack_dir()
            if root != self._root:  # another data directory (tests switch settings)
                self._root, self._packs, self._where = root, {}, {}
            stems = pack_stems()
            gone = set(self._packs) - set(stems)
            for stem in stems:
                pack = self._packs.setdefault(stem, _Pack())
                try:
                    records, pack.read_to = read_records(root / f"{stem}.idx", pack.read_to)
                except FileNotFoundError:
                    gone.add(stem)
                    continue
                for key, offset, length in records:
                    pack.refs[key] = (offset, length)
                    self._where[key] = (stem, offset, length)
            if gone:
                for stem in gone:
                    self._packs.pop(stem, None)
                self._where = {
                    key: (stem, offset, length)
                    for stem, pack in self._packs.items()
                    for key, (offset, length) in pack.refs.items()
                }

    def learn(self, stem: str, records: list[bytes]) -> None:
        """What the writer itself just stored (without reading its index back)."""
        with self._lock:
            for record in records:
                key, offset, length = RECORD.unpack(record)
                self._where[key] = (stem, offset, length)

    def find(self, key: bytes) -> tuple[str, int, int] | None:
        return self._where.get(key)

    def __contains__(self, key: bytes) -> bool:
        return key in self._where


_index = PackIndex()


def _read_packed(ref: str) -> str | None:
    key = bytes.fromhex(ref)
    for attempt in range(3):
        place = _index.find(key)
        if place is None:
            if attempt:
                return None
            _index.refresh()
            continue
        stem, offset, length = place
        try:
            with open(pack_dir() / f"{stem}.pack", "rb") as fh:
                fh.seek(offset)
                data = fh.read(length)
        except FileNotFoundError:  # compacted by prune since we looked: look again
            _index.refresh()
            continue
        return data.decode("utf-8", errors="replace")
    return None


def blob_get(ref: str) -> str | None:
    if not is_ref(ref):
        return None
    text = _read_packed(ref)
    if text is not None:
        return text
    try:
        return blob_path(ref).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def pack_rewrite(stem: str, records: list[tuple[bytes, int, int]]) -> str:
    """A copy of a pack with only `records`, under the next generation's name (prune);
    returns the new stem. The copy is durable and complete before its index appears."""
    base, _, generation = stem.partition("~")
    new = f"{base}~{int(generation or 0) + 1}"
    directory = pack_dir()
    texts: list[bytes] = []
    index: list[bytes] = []
    offset = 0
    with open(directory / f"{stem}.pack", "rb") as source:
        for key, old_offset, length in records:
            source.seek(old_offset)
            data = source.read(length)
            texts.append(data)
            index.append(RECORD.pack(key, offset, length))
            offset += length
    for suffix, parts in ((".pack", texts), (".idx", index)):
        tmp = directory / f".{new}{suffix}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(b"".join(parts))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / f"{new}{suffix}")
    fsync_dir(directory)
    return new


class PackWriter:
    """The recorder's side: `add` a batch's payloads, then `sync` once before the batch's
    events become visible. Texts already stored (in a pack, or as a file of the old
    layout) are not stored again."""

    def __init__(self) -> None:
        self.index = PackIndex()
        self.index.refresh()
        self._legacy = any(p.is_dir() for p in blob_dir().glob("[0-9a-f][0-9a-f]"))
        self._stem = ""
        self._pack_fh: BinaryIO | None = None
        self._idx_fh: BinaryIO | None = None
        self._end = 0  # the pack's size once the pending texts are written
        self._texts: list[bytes] = []
        self._records: list[bytes] = []
        self._pending: set[bytes] = set()
        self._seen_dir = self._dir_mtime()

    @staticmethod
    def _dir_mtime() -> int:
        try:
            return pack_dir().stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def notice_prune(self) -> None:
        """Before a batch: when packs were rewritten or removed (prune), forget the blobs
        that are gone, so that a text stored again is written again."""
        mtime = self._dir_mtime()
        if mtime != self._seen_dir:
            self._seen_dir = mtime
            self.index.refresh()

    def open(self) -> None:
        """Start this life's pack (also when nothing is written yet: a pack left by an
        earlier life is then no longer the newest, and prune may compact it)."""
        self.close()
        directory = pack_dir()
        directory.mkdir(parents=True, exist_ok=True)
        self._stem = pack_name(time.time_ns(), os.getpid())
        self._pack_fh = open(directory / f"{self._stem}.pack", "ab")  # noqa: SIM115
        self._idx_fh = open(directory / f"{self._stem}.idx", "ab")  # noqa: SIM115
        self._end = self._pack_fh.tell()
        fsync_dir(directory)

    def close(self) -> None:
        for fh in (self._pack_fh, self._idx_fh):
            if fh is not None:
                fh.close()
        self._pack_fh = self._idx_fh = None

    def add(self, ref: str, text: str) -> None:
        key = bytes.fromhex(ref)
        if key in self._pending or key in self.index:
            return
        if self._legacy and blob_path(ref).exists():
            return
        if self._pack_fh is None:
            self.open()
        data = text.encode("utf-8", "surrogatepass")
        self._texts.append(data)
        self._records.append(RECORD.pack(key, self._end, len(data)))
        self._end += len(data)
        self._pending.add(key)

    def sync(self) -> None:
        """Make the batch's texts durable, then their index records."""
        if not self._records or self._pack_fh is None or self._idx_fh is None:
            return
        self._pack_fh.write(b"".join(self._texts))
        self._pack_fh.flush()
        os.fdatasync(self._pack_fh.fileno())
        self._idx_fh.write(b"".join(self._records))
        self._idx_fh.flush()
        os.fdatasync(self._idx_fh.fileno())
        self.index.learn(self._stem, self._records)
        self._texts, self._records, self._pending = [], [], set()
        if self._end > ROTATE_BYTES:
            self.open()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
