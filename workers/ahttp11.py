"""The asyncio twin of workers/http11.py: one kept-alive HTTP/1.1 client connection on
asyncio streams, for a worker whose slots are tasks of one event loop (workers/aslots.py).

The framing and the refusals are http11's own (`status_line`, `header_line`, `framing`,
`chunk_size`), so a reply either reads the same way and fails with the same
`http.client` exception."""

from __future__ import annotations

import asyncio
import http.client
import ssl

from workers.http11 import (
    MAX_LINE,
    Reply,
    chunk_size,
    framing,
    header_line,
    request_bytes,
    status_line,
)


class AsyncConnection:
    """A connection to one endpoint, opened on first use (`open`) and again after `close`."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @property
    def open_(self) -> bool:
        return self.writer is not None

    async def open(self, timeout: float | None) -> None:
        async with asyncio.timeout(timeout):
            self.reader, self.writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.host if self.tls is not None else None,
                limit=MAX_LINE + 2,
            )  # asyncio sets TCP_NODELAY on its TCP connections

    def close(self) -> None:
        writer, self.reader, self.writer = self.writer, None, None
        if writer is not None:
            writer.close()

    async def exchange(
        self,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        read_s: float | None,
    ) -> Reply:
        """Send the request as given (its headers name the host and the body's length)
        and read the reply whole, within `read_s` (TimeoutError past it)."""
        if self.reader is None or self.writer is None:
            raise http.client.NotConnected("open the connection first")
        self.writer.write(request_bytes(method, target, headers, body))
        async with asyncio.timeout(read_s):
            await self.writer.drain()
            return await _reply(self.reader, method)


async def _reply(reader: asyncio.StreamReader, method: str) -> Reply:
    while True:
        version, status = status_line(await _line(reader))
        headers = await _headers(reader)
        if not 100 <= status < 200 or status == 101:
            break  # a 1xx (100 Continue, 103 Early Hints) comes before the reply
    body, length, will_close = framing(version, status, headers, method)
    if body == "none":
        content = b""
    elif body == "chunked":
        content = await _chunked(reader)
    elif body == "length":
        content = await _exactly(reader, length)
    else:  # delimited by the server's close
        content = await reader.read()
    return Reply(status, headers, content, will_close)


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readline()
    except ValueError as exc:  # past the stream's limit: MAX_LINE
        raise http.client.LineTooLong("status or header line") from exc


async def _headers(reader: asyncio.StreamReader) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    while not header_line(await _line(reader), headers):
        pass
    return headers


async def _exactly(reader: asyncio.StreamReader, length: int) -> bytes:
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise http.client.IncompleteRead(exc.partial, length - len(exc.partial)) from exc


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    pieces: list[bytes] = []
    while True:
        size = chunk_size(await _line(reader), pieces)
        if size == 0:
            await _headers(reader)  # the trailer, if any, and the blank line that ends it
            return b"".join(pieces)
        pieces.append(await _exactly(reader, size))
        if await _line(reader) not in (b"\r\n", b"\n"):
            raise http.client.IncompleteRead(b"".join(pieces))
