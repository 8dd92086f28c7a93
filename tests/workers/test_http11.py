"""workers/http11.py, and its asyncio twin workers/ahttp11.py, against a server on loopback
that answers with exact bytes: the ways a reply may be framed, and replies that are not
HTTP, each refused with http.client's own error (which the transports map as before,
tests/workers/test_http_transport.py). Every case runs on both."""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from workers.ahttp11 import AsyncConnection
from workers.http11 import MAX_HEADERS, Connection

HEADERS = [(b"Host", b"127.0.0.1"), (b"Content-Length", b"2")]


class OnALoop:
    """An AsyncConnection driven from the test's thread through an event loop of its own."""

    def __init__(self, host: str, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.conn = AsyncConnection(host, port)

    def open(self, timeout: float) -> None:
        self.loop.run_until_complete(self.conn.open(timeout))

    def exchange(self, *args):
        return self.loop.run_until_complete(self.conn.exchange(*args))

    def close(self) -> None:
        self.conn.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


@pytest.fixture(params=[Connection, OnALoop], ids=["threads", "asyncio"])
def make(request):
    return request.param


@contextmanager
def answering(
    make, *replies: bytes, close: bool = False
) -> Iterator[tuple[Connection, list[bytes]]]:
    """A server that reads one request per reply and writes that reply's bytes; with
    `close`, it hangs up after the last. The connection to it, and the requests it read."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for reply in replies:
                seen.append(conn.recv(65536))
                conn.sendall(reply)
            if not close:
                conn.recv(1)  # until the client goes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = make("127.0.0.1", listener.getsockname()[1])
    client.open(5.0)
    try:
        yield client, seen
    finally:
        client.close()
        listener.close()
        thread.join(5)


def ask(conn: Connection, method: str = "POST"):
    return conn.exchange(method, "/v1/chat/completions", HEADERS, b"{}", 5.0)


def test_it_writes_the_request_as_given_and_reads_replies_on_one_connection(make) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi"
    with answering(make, ok, ok) as (conn, seen):
        first, second = ask(conn), ask(conn)
    assert seen[0] == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert (first.status, first.content, first.will_close) == (200, b"hi", False)
    assert (b"X-A", b"b") in second.headers and second.content == b"hi"


def test_chunked_with_a_trailer_and_an_interim_continue_before_the_reply(make) -> None:
    reply = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    with answering(make, reply) as (conn, _):
        got = ask(conn)
    assert (got.status, got.content) == (200, b"abc0123456789")


def test_a_reply_without_a_length_runs_to_the_close_and_closes(make) -> None:
    with answering(make, b"HTTP/1.0 200 OK\r\n\r\nall of it", close=True) as (conn, _):
        got = ask(conn)
    assert (got.content, got.will_close) == (b"all of it", True)


def test_it_says_when_the_server_will_close_and_reads_no_body_where_there_is_none(make) -> None:
    replies = (
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",  # a HEAD's length, no body
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 1\r\n\r\nx",
    )
    with answering(make, *replies) as (conn, _):
        assert ask(conn).content == b""
        assert ask(conn, "HEAD").content == b""
        assert ask(conn).will_close


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"", http.client.RemoteDisconnected),  # closed before a reply
        (b"SSH-2.0-OpenSSH\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 20 OK\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", http.client.IncompleteRead),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", http.client.HTTPException),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
            http.client.HTTPException,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nabcde\r\n0\r\n\r\n",
            http.client.IncompleteRead,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            http.client.IncompleteRead,
        ),
        (b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", http.client.LineTooLong),
        (
            b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n",
            http.client.HTTPException,
        ),
    ],
)
def test_a_reply_that_is_not_sound_http_is_refused_with_http_clients_error(
    make, reply, error
) -> None:
    with answering(make, reply, close=True) as (conn, _):
        with pytest.raises(error):
            ask(conn)
