"""The web server (frlm_web/web_server.py) against large request bodies, signed in or not:
one over FRLM_HTTP_MAX_BODY is refused with 413 before it is read, and one within it costs
the process about its size, not the twelve times Twisted's form parsing cost (a review
measured +1.4 GB for one anonymous 128 MB multipart POST to the sign-in page). Each test
failed before the server bounded its bodies."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

from django.conf import settings

MB = 1024 * 1024
BOUNDARY = "----frlmtest"


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """A process's resident memory, sampled every 20 ms while a request runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.before = pid, rss_mb(pid)
        self.peak = self.before
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        time.sleep(0.3)
        self.done.set()
        self.thread.join()

    @property
    def grew_mb(self) -> int:
        return self.peak - self.before


def post_multipart(web: str, path: str, file_mb: int, *, chunked: bool = False) -> str:
    """A form post of one `file_mb` MB file field, sent as fast as the server reads it; the
    status line and headers the server answered (as much as came before it closed)."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="context_file"; '
        'filename="corpus.txt"\r\nContent-Type: text/plain\r\n\r\n'
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    length = len(head) + file_mb * MB + len(tail)
    parts = urlsplit(web)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=120)
    framing = (
        "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {length}\r\n"
    ).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
        + f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n".encode()
        + framing
        + b"\r\n"
    )
    line = (b"a line of the corpus\n" * (MB // 21 + 1))[:MB]
    pieces = [head, *([line] * file_mb), tail]
    try:
        for piece in pieces:
            if chunked:
                piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            sock.sendall(piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # closed on us: the answer is read below
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            got = sock.recv(65536)
            if not got:
                break
            answer += got
    except OSError:
        pass
    sock.close()
    return answer.decode(errors="replace")


def web_pid(stack) -> int:
    return stack.procs["web"].popen.pid


def test_a_body_over_the_limit_is_refused_before_it_is_read(stack, web):
    limit_mb = settings.FRLM_HTTP_MAX_BODY // MB
    for chunked in (False, True):
        with PeakRss(web_pid(stack)) as rss:
            answer = post_multipart(web, "/accounts/login/", 2 * limit_mb, chunked=chunked)
        assert answer.startswith("HTTP/1.1 413"), (chunked, answer[:300])
        assert rss.grew_mb < 64, f"the server grew by {rss.grew_mb} MB (chunked: {chunked})"


def test_a_body_within_the_limit_costs_about_its_size(stack, web):
    with PeakRss(web_pid(stack)) as rss:
        answer = post_multipart(web, "/accounts/login/", 48)
    assert answer.startswith("HTTP/1.1 403"), answer[:300]  # no CSRF token: refused, read
    assert rss.grew_mb < 2 * 48, f"the server grew by {rss.grew_mb} MB for a 48 MB body"
