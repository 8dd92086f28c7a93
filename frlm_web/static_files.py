"""The web server's static files (`/static/...`), answered from memory on the event loop.

daphne serves the files itself (there is no proxy in front of it by default). Django's
ASGIStaticFilesHandler did that through the finders and a file read per request, on the
same single thread as every sync view: on a cold load of the run page the stylesheet
came ~300 ms after the page and its scripts ~450 ms after it, queued behind one another
and behind the trace's answer (bench/ui.py, "got ..." marks). Here each file is found
once (django.contrib.staticfiles.finders, off the loop), read, gzipped once when that
pays (text over 1 kB), and kept with its ETag; a request is answered from memory, 304
when the browser's copy is current. A file changed on disk (a developer's edit) is read
again: its size and mtime are checked on each request.

Only GET and HEAD; a path that leaves the static directories (`..`, an absolute path, a
NUL) is a 404 like a missing file.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import mimetypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from django.conf import settings
from django.contrib.staticfiles import finders

GZIP_ABOVE = 1024  # bytes; smaller text goes plain
TEXT = ("text/", "application/javascript", "application/json", "image/svg+xml")


@dataclass(frozen=True)
class Entry:
    path: Path
    stamp: tuple[int, int]  # size, mtime_ns: read again when either changes
    body: bytes
    packed: bytes | None  # gzipped, when smaller by enough to pay
    etag: bytes
    content_type: bytes


def gzip_accepted(value: str) -> bool:
    """Whether an Accept-Encoding header value takes gzip."""
    return any(c.split(";")[0].strip() in ("gzip", "*") for c in value.split(","))


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def load_file(relative: str) -> Entry | None:
    """Find and read a static file, gzipped and with its ETag; None when no finder has it."""
    found = finders.find(relative)
    if not found or not os.path.isfile(found):
        return None
    path = Path(found)
    stamp = _stamp(path)
    body = path.read_bytes()
    kind = mimetypes.guess_type(relative)[0] or "application/octet-stream"
    text = kind.startswith(TEXT)
    packed = gzip.compress(body, compresslevel=9, mtime=0) if text else None
    if packed is not None and (len(body) <= GZIP_ABOVE or len(packed) > 0.9 * len(body)):
        packed = None
    if text:
        kind += "; charset=utf-8"
    etag = b'"' + hashlib.sha256(body).hexdigest()[:20].encode() + b'"'
    return Entry(path, stamp, body, packed, etag, kind.encode())


def _relative(path: str, prefix: str) -> str | None:
    """The file's path under the static directories, or None if it tries to leave them."""
    relative = unquote(path[len(prefix) :])
    parts = relative.split("/")
    if not relative or "\x00" in relative or "\\" in relative or relative.startswith("/"):
        return None
    if any(part in ("", ".", "..") for part in parts):
        return None
    return relative


class StaticFiles:
    """ASGI middleware: `/static/...` from memory, anything else to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.prefix = urlparse(settings.STATIC_URL).path
        if not self.prefix.startswith("/"):
            self.prefix = "/" + self.prefix
        self.entries: dict[str, Entry] = {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, [(b"allow", b"GET, HEAD")], b"only GET and HEAD\n")
            return
        relative = _relative(scope["path"], self.prefix)
        entry = await self._entry(relative) if relative else None
        if entry is None:
            await _answer(send, 404, [], b"no such static file\n")
            return
        headers = dict(scope.get("headers") or [])
        common = [
            (b"etag", entry.etag),
            (b"cache-control", b"no-cache"),  # kept, and asked again with If-None-Match
            (b"vary", b"Accept-Encoding"),
            (b"x-content-type-options", b"nosniff"),
        ]
        if headers.get(b"if-none-match") == entry.etag:
            await _answer(send, 304, common, b"")
            return
        body, extra = entry.body, [(b"content-type", entry.content_type)]
        if entry.packed is not None and gzip_accepted(
            headers.get(b"accept-encoding", b"").decode("latin-1")
        ):
            body = entry.packed
            extra.append((b"content-encoding", b"gzip"))
        await _answer(
            send, 200, common + extra, b"" if scope["method"] == "HEAD" else body, length=len(body)
        )

    async def _entry(self, relative: str) -> Entry | None:
        entry = self.entries.get(relative)
        try:
            if entry is not None and _stamp(entry.path) == entry.stamp:
                return entry
        except OSError:
            pass  # gone since: look again
        entry = await asyncio.to_thread(load_file, relative)
        if entry is None:
            self.entries.pop(relative, None)
        else:
            self.entries[relative] = entry
        return entry


async def _answer(
    send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes, length: int = -1
) -> None:
    size = len(body) if length < 0 else length
    if status == 304:
        head = headers
    else:
        head = [*headers, (b"content-length", str(size).encode())]
        if status >= 400:
            head.append((b"content-type", b"text/plain; charset=utf-8"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
