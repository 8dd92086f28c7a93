"""Fragments carried by sub-queries: a prompt may hold markers
``<<frlm:fragment {"path":..., "chars":[a,b], "bytes":[x,y], "sha256":...}>>`` (written by
the REPL's Fragment objects, runs/sandbox/lazytext.py) in place of text. The worker that
runs the sub-query reads only those byte ranges from the file, checks each against its
sha256, and puts the text where the marker was; the conductor never holds it.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from frlm_web import jsontext

MARKER = re.compile(r"<<frlm:fragment (\{[^\n]*?\})>>")
MARKER_TEXT = "<<frlm:fragment {}>>"
MARKER_OPEN = "<<frlm:fragment "  # a prompt without it carries no fragment
# One sub-query's fragments together: a worker model reads far less than this.
MAX_FRAGMENT_BYTES = 32 * 1024 * 1024
COPY_CHUNK = 1 << 20  # what a fragment copied to a file is read and written by


class FragmentRef(TypedDict):
    path: str
    chars: list[int]  # [start, end) in the context, in characters
    bytes: list[int]  # [start, end) in the file, in bytes
    sha256: str  # of those bytes


class FragmentError(ValueError):
    """A fragment reference cannot be used; the message says which and why."""


class Loaded(TypedDict):
    path: str
    bytes: int
    chars: int
    ms: float


def carries(prompt: str) -> bool:
    """Whether a prompt has a fragment marker, well formed or not (`fill` reads and checks it)."""
    return MARKER_OPEN in prompt


def refs(prompt: str) -> list[FragmentRef]:
    """The fragment references in a prompt, checked for shape; FragmentError if malformed."""
    found: list[FragmentRef] = []
    for match in MARKER.finditer(prompt):
        found.append(parse_ref(match.group(1)))
    return found


def prompt_tokens(prompt: str) -> int:
    """Roughly the tokens a worker model will read: the prompt's own text plus the text of
    the fragments its markers stand for (about four characters a token). A malformed
    marker counts as the text it is; the conductor refuses it elsewhere."""
    if "<<frlm:fragment" not in prompt:
        return len(prompt) // 4
    chars = 0
    rest = len(prompt)
    for match in MARKER.finditer(prompt):
        rest -= len(match.group(0))
        try:
            start, end = parse_ref(match.group(1))["chars"]
        except FragmentError:
            rest += len(match.group(0))
            continue
        chars += end - start
    return (rest + chars) // 4


def parse_ref(raw: str) -> FragmentRef:
    try:
        data: Any = jsontext.loads(raw)
    except ValueError as exc:
        raise FragmentError(f"a fragment marker is not valid JSON: {raw[:80]!r}") from exc
    if not isinstance(data, dict):
        raise FragmentError("a fragment marker must hold a JSON object")
    path, chars, spans, digest = (data.get(k) for k in ("path", "chars", "bytes", "sha256"))
    if not isinstance(path, str) or not path:
        raise FragmentError("a fragment marker has no path")
    for name, pair in (("chars", chars), ("bytes", spans)):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            or not 0 <= pair[0] <= pair[1]
        ):
            raise FragmentError(
                f"a fragment marker's {name} must be [start, end] with 0 <= start <= end"
            )
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise FragmentError("a fragment marker's sha256 must be 64 hex digits")
    return {"path": path, "chars": chars, "bytes": spans, "sha256": digest}


def fill(prompt: str) -> tuple[str, list[Loaded]]:
    """The prompt with each marker replaced by its fragment's text, and what was loaded.

    FragmentError when a file is missing or unreadable here, a range lies outside the file,
    the bytes no longer match their sha256 (the context changed), or they are too many.
    """
    wanted = refs(prompt)
    if not wanted:
        return prompt, []
    total = sum(ref["bytes"][1] - ref["bytes"][0] for ref in wanted)
    if total > MAX_FRAGMENT_BYTES:
        raise FragmentError(
            f"the prompt's fragments come to {total:,} bytes, more than the {MAX_FRAGMENT_BYTES:,} "
            "a sub-query may carry; send smaller fragments"
        )
    loaded: list[Loaded] = []
    texts: list[str] = []
    for ref in wanted:
        started = time.perf_counter()
        text = read(ref)
        texts.append(text)
        loaded.append(
            {
                "path": ref["path"],
                "bytes": ref["bytes"][1] - ref["bytes"][0],
                "chars": len(text),
                "ms": round((time.perf_counter() - started) * 1000, 3),
            }
        )
    pieces = iter(texts)
    return MARKER.sub(lambda _m: next(pieces), prompt), loaded


def read(ref: FragmentRef) -> str:
    """The fragment's text, checked against its sha256 (FragmentError if it is not there
    or not the same)."""
    start, end = ref["bytes"]
    data = b"".join(_chunks(ref, max(1, end - start)))
    return data.decode("utf-8", errors="replace")


def copy(ref: FragmentRef, target: Path) -> int:
    """The fragment's text, as `read` gives it, written to `target` COPY_CHUNK at a time:
    a child RLM's context may be most of a context of gigabytes, which the conductor read
    whole, as bytes and again as text (a review). Returns its length in characters; the
    target is removed when the fragment fails its checks."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chars = 0
    try:
        with open(target, "w", encoding="utf-8") as out:
            for data in _chunks(ref, COPY_CHUNK):
                text = decoder.decode(data)
                chars += len(text)
                out.write(text)
            text = decoder.decode(b"", final=True)
            chars += len(text)
            out.write(text)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return chars


def _chunks(ref: FragmentRef, size: int) -> Iterator[bytes]:
    """The fragment's bytes, `size` at a time; past the last, FragmentError unless they
    were all there and match the sha256."""
    start, end = ref["bytes"]
    digest, left = hashlib.sha256(), end - start
    try:
        with open(ref["path"], "rb") as handle:
            handle.seek(start)
            while left > 0:
                data = handle.read(min(size, left))
                if not data:
                    break
                digest.update(data)
                left -= len(data)
                yield data
    except FileNotFoundError as exc:
        raise FragmentError(
            f"the fragment's file {ref['path']} is not on this worker; fragments need the "
            "context on a filesystem the workers share with the conductor"
        ) from exc
    except OSError as exc:
        raise FragmentError(f"the fragment's file {ref['path']} cannot be read: {exc}") from exc
    if left:
        raise FragmentError(
            f"the fragment bytes {start}:{end} lie beyond the end of {ref['path']}; the "
            "context changed since the run started"
        )
    if digest.hexdigest() != ref["sha256"]:
        raise FragmentError(
            f"the fragment bytes {start}:{end} of {ref['path']} do not match their sha256; "
            "the context changed since the run started"
        )
