"""One kept-alive HTTP/1.1 client connection: a request written in one send, its reply read
whole. The part of HTTP a model call uses, under workers/http_transport.py.

`http.client` spent about twice the CPU on each small request and reply (a header at a
time through `putheader`, the reply's headers through the `email` package's parser):
bench/modelcall.py's bare call took 174-179 µs through it and 77-94 µs through this, and
the openai client's whole call as a worker makes it went from 632 to 553 µs (one thread)
and from 763 to 602 µs (16 threads) at 1 ms model latency (issue 18).

Replies may come with a Content-Length, chunked, or (HTTP/1.0 style) until the server
closes; 1xx replies before the real one are skipped. Failures are `http.client`'s own
exceptions, so callers map them as before: a server that closed the connection before
replying is `RemoteDisconnected`, a reply cut short `IncompleteRead`, a reply that is not
HTTP `BadStatusLine` or `LineTooLong`."""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from typing import BinaryIO

MAX_LINE = 65536  # a status or header line (http.client's limit)
MAX_HEADERS = 100  # header lines in one reply (http.client's limit)
NO_BODY = frozenset({204, 304})


@dataclass
class Reply:
    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes
    will_close: bool  # the server closes the connection after this reply


class Connection:
    """A connection to one endpoint, opened on first use (`open`) and again after `close`."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.sock: socket.socket | None = None
        self._in: BinaryIO | None = None

    def open(self, timeout: float | None) -> None:
        sock = socket.create_connection((self.host, self.port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._in = sock.makefile("rb")

    def close(self) -> None:
        reader, sock = self._in, self.sock
        self._in = self.sock = None
        if reader is not None:
            reader.close()
        if sock is not None:
            sock.close()

    def exchange(
        self,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        read_s: float | None,
    ) -> Reply:
        """Send the request as given (its headers name the host and the body's length)
        and read the reply whole."""
        if self.sock is None or self._in is None:
            raise http.client.NotConnected("open the connection first")
        self.sock.settimeout(read_s)
        self.sock.sendall(request_bytes(method, target, headers, body))
        return self._reply(self._in, method)

    def _reply(self, reader: BinaryIO, method: str) -> Reply:
        while True:
            version, status = status_line(_line(reader))
            headers = _headers(reader)
            if not 100 <= status < 200 or status == 101:
                break  # a 1xx (100 Continue, 103 Early Hints) comes before the reply
        body, length, will_close = framing(version, status, headers, method)
        if body == "none":
            content = b""
        elif body == "chunked":
            content = _chunked(reader)
        elif body == "length":
            content = _exactly(reader, length)
        else:  # delimited by the server's close
            content = reader.read()
        return Reply(status, headers, content, will_close)


def status_line(line: bytes) -> tuple[bytes, int]:
    """The version and status of a reply's first line (empty: the server closed)."""
    if not line:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    fields = line.split(None, 2)
    if (
        len(fields) < 2
        or not fields[0].startswith(b"HTTP/1.")
        or len(fields[1]) != 3
        or not fields[1].isdigit()
    ):
        raise http.client.BadStatusLine(repr(line[:200]))
    return fields[0], int(fields[1])


def framing(
    version: bytes, status: int, headers: list[tuple[bytes, bytes]], method: str
) -> tuple[str, int, bool]:
    """How the reply's body is framed: "none", "chunked", "length" (of `length` bytes) or
    "close" (until the server closes); and whether the server closes after it."""
    length: int | None = None
    chunked = False
    connection = b""
    for name, value in headers:
        key = name.lower()
        if key == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise http.client.HTTPException(f"bad Content-Length {value[:40]!r}")
            length = int(value)
        elif key == b"transfer-encoding":
            chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
        elif key == b"connection":
            connection = value.lower()
    tokens = {token.strip() for token in connection.split(b",")}
    will_close = b"close" in tokens or (version == b"HTTP/1.0" and b"keep-alive" not in tokens)
    if method == "HEAD" or status in NO_BODY or 100 <= status < 200:
        return "none", 0, will_close
    if chunked:
        return "chunked", 0, will_close
    if length is not None:
        return "length", length, will_close
    return "close", 0, True


def request_bytes(
    method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """The request as sent: its line, the headers as given, the body."""
    parts = [f"{method} {target} HTTP/1.1\r\n".encode("ascii")]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


def _line(reader: BinaryIO) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise http.client.LineTooLong("status or header line")
    return line


def _headers(reader: BinaryIO) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    while not header_line(_line(reader), headers):
        pass
    return headers


def header_line(line: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """Take one line of a header block into `headers`; True at the blank line that ends it."""
    if line in (b"\r\n", b"\n"):
        return True
    if not line:
        raise http.client.IncompleteRead(b"", None)  # closed inside the headers
    if len(headers) >= MAX_HEADERS:
        raise http.client.HTTPException(f"more than {MAX_HEADERS} headers")
    name, colon, value = line.partition(b":")
    if not colon or not name or name != name.strip():
        raise http.client.HTTPException(f"bad header line {line[:80]!r}")
    headers.append((name, value.strip()))
    return False


def _exactly(reader: BinaryIO, length: int) -> bytes:
    data = reader.read(length)
    if len(data) < length:
        raise http.client.IncompleteRead(data, length - len(data))
    return data


def chunk_size(line: bytes, pieces: list[bytes]) -> int:
    """The size a chunk's first line gives (0: the last chunk)."""
    size_text = line.split(b";", 1)[0].strip()
    if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
        raise http.client.IncompleteRead(b"".join(pieces))  # cut, or not a chunk size
    return int(size_text, 16)


def _chunked(reader: BinaryIO) -> bytes:
    pieces: list[bytes] = []
    while True:
        size = chunk_size(_line(reader), pieces)
        if size == 0:
            _headers(reader)  # the trailer, if any, and the blank line that ends it
            return b"".join(pieces)
        pieces.append(_exactly(reader, size))
        if _line(reader) not in (b"\r\n", b"\n"):
            raise http.client.IncompleteRead(b"".join(pieces))
