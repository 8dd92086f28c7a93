"""workers/http_transport.py under the openai client, against real HTTP/1.1 servers on
loopback: connections kept alive and reopened, bodies the way servers send them, and each
failure raised as the error the SDK maps. The cases through the SDK run twice: a thread's
OpenAI over KeptAliveTransport, and an event loop's AsyncOpenAI over
AsyncKeptAliveTransport (an asyncio worker's, workers/aslots.py)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import httpx
import openai
import pytest

from frlm_web.stack import free_port
from tests.helpers import http_serving
from workers.backends import ModelError, ModelSpec, achat, chat
from workers.http_transport import (
    AsyncKeptAliveTransport,
    KeptAliveTransport,
    ModelHTTPClient,
    for_url,
)

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
REPLY = json.dumps(
    {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1},
    }
).encode()


@contextmanager
def server(mode: str = "plain", delay_s: float = 0.0) -> Iterator[tuple[str, dict]]:
    """An HTTP/1.1 server that keeps connections alive. `mode`: plain, gzip, chunked, or
    close_idle (it closes each connection right after answering, without saying so)."""
    seen: dict = {"connections": set(), "requests": 0, "headers": []}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen["connections"].add(self.client_address)
            seen["requests"] += 1
            seen["headers"].append({k.lower(): v for k, v in self.headers.items()})
            time.sleep(delay_s)
            body = gzip.compress(REPLY) if mode == "gzip" else REPLY
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if mode == "gzip":
                self.send_header("Content-Encoding", "gzip")
            if mode == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for piece in (body[:10], body[10:]):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            if mode == "close_idle":
                self.close_connection = True  # no "Connection: close": the client must cope

        def log_message(self, *_: object) -> None:
            pass

    with http_serving(Handler) as url:
        yield url, seen


class OnALoop:
    """AsyncOpenAI over AsyncKeptAliveTransport, called from the test's thread through an
    event loop of its own."""

    def __init__(self, url: str, timeout: float, retries: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.sdk = openai.AsyncOpenAI(
            base_url=url,
            api_key="sk-test",
            timeout=timeout,
            max_retries=retries,
            http_client=httpx.AsyncClient(transport=AsyncKeptAliveTransport(), timeout=timeout),
        )

    def post(self, *args, **kwargs) -> httpx.Response:
        return self.loop.run_until_complete(self.sdk.post(*args, **kwargs))


@pytest.fixture(params=["threads", "asyncio"])
def kind(request) -> str:
    return request.param


def client(url: str, timeout: float = 10.0, retries: int = 0, *, kind: str = "threads"):
    if kind == "asyncio":
        return OnALoop(url, timeout, retries)
    return openai.OpenAI(
        base_url=url,
        api_key="sk-test",
        timeout=timeout,
        max_retries=retries,
        http_client=httpx.Client(transport=KeptAliveTransport(), timeout=timeout),
    )


def post(sdk: openai.OpenAI | OnALoop) -> dict:
    body = {"model": "m", "messages": MESSAGES}
    return sdk.post("/chat/completions", body=body, cast_to=httpx.Response).json()


def test_it_keeps_one_connection_alive_per_thread_and_sends_the_sdks_headers(kind):
    with server() as (url, seen):
        sdk = client(url, kind=kind)
        replies = [post(sdk) for _ in range(5)]
    assert all(r["choices"][0]["message"]["content"] == "4" for r in replies)
    assert seen["requests"] == 5 and len(seen["connections"]) == 1
    headers = seen["headers"][0]
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["content-type"] == "application/json"
    assert headers["x-stainless-lang"] == "python"  # the SDK's own, passed through as they are


def test_a_thread_made_per_call_leaves_no_connection_open():
    """A root model's turn is called on a thread of its own (runs/engine/turns.py); the
    transport kept each such thread's connection open for good (a review: one socket a
    turn). close_thread_connections, as the thread ends, closes it."""
    import threading

    from workers.http_transport import close_thread_connections

    transport = KeptAliveTransport()
    sdk = openai.OpenAI(
        base_url="", api_key="sk-test", max_retries=0,
        http_client=httpx.Client(transport=transport, timeout=10.0),
    )  # fmt: skip

    def turn(close: bool) -> None:
        post(sdk)
        if close:
            close_thread_connections()

    with server() as (url, seen):
        sdk.base_url = url
        for close in (False, False, True, True):
            thread = threading.Thread(target=turn, args=(close,))
            thread.start()
            thread.join()
    assert seen["requests"] == 4 and len(seen["connections"]) == 4
    assert len(transport._all) == 2  # the two threads that did not close theirs


def test_a_connection_the_server_closed_while_idle_is_opened_again_not_retried(kind):
    with server("close_idle") as (url, seen):
        sdk = client(url, retries=0, kind=kind)  # a retry would fail the test: there are none
        for _ in range(3):
            assert post(sdk)["usage"]["prompt_tokens"] == 7
            time.sleep(0.05)  # the server's close arrives while the connection idles
    assert seen["requests"] == 3 and len(seen["connections"]) == 3
    assert all(
        "x-stainless-retry-count" not in h or h["x-stainless-retry-count"] == "0"
        for h in seen["headers"]
    )


@pytest.mark.parametrize("mode", ["gzip", "chunked"])
def test_it_hands_the_body_to_httpx_as_sent_and_httpx_decodes_it(mode: str, kind):
    with server(mode) as (url, _):
        assert post(client(url, kind=kind))["choices"][0]["message"]["content"] == "4"


def test_a_reply_slower_than_the_timeout_is_the_sdks_timeout_error(kind):
    with server(delay_s=1.0) as (url, _):
        with pytest.raises(openai.APITimeoutError):
            post(client(url, timeout=0.2, kind=kind))


def test_a_refused_connection_is_the_sdks_connection_error_and_a_clear_model_error(kind):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(openai.APIConnectionError) as caught:
        post(client(url, kind=kind))
    assert not isinstance(caught.value, openai.APITimeoutError)
    with pytest.raises(ModelError, match="cannot reach the model endpoint"):
        if kind == "asyncio":
            asyncio.run(achat(ModelSpec("openai", "m", url), MESSAGES, retries=0))
        else:
            chat(ModelSpec("openai", "m", url), MESSAGES, retries=0)


def test_a_server_that_hangs_up_mid_reply_is_a_connection_error(kind):
    """Not a kept-alive connection gone stale: a fresh one, cut while the reply is read."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def cut() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choi')
        conn.close()

    threading.Thread(target=cut, daemon=True).start()
    try:
        with pytest.raises(openai.APIConnectionError):
            post(client(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", kind=kind))
    finally:
        listener.close()


def test_the_default_transport_serves_an_endpoint_the_environment_proxies(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert isinstance(for_url("http://127.0.0.1:8000/v1"), KeptAliveTransport)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert for_url("https://api.openai.com/v1") is None
    assert isinstance(for_url("http://127.0.0.1:8000/v1"), KeptAliveTransport)
    monkeypatch.setenv("NO_PROXY", "api.openai.com")
    assert isinstance(for_url("https://api.openai.com/v1"), KeptAliveTransport)
    assert for_url("https://api.openai.com/v1", "httpx") is None  # FRLM_MODEL_TRANSPORT=httpx


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "frlm test endpoint")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


def test_it_speaks_tls_and_trusts_what_httpx_would(tmp_path, monkeypatch):
    """An endpoint whose certificate nobody vouches for is refused; named in SSL_CERT_FILE
    (which httpx honours), it is reached, over one kept connection."""
    import ssl

    cert_file, key_file = self_signed(tmp_path)
    with server() as (url, seen):
        # The same handler behind TLS: wrap the running server's socket.
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert_file, key_file)
        front = socket.create_server(("127.0.0.1", 0))
        stop = threading.Event()

        def relay() -> None:
            """TLS on the front port, plain HTTP to the server behind it."""
            while not stop.is_set():
                try:
                    raw, _ = front.accept()
                except OSError:
                    return
                threading.Thread(target=pipe_tls, args=(tls, raw, port), daemon=True).start()

        threading.Thread(target=relay, daemon=True).start()
        https = f"https://127.0.0.1:{front.getsockname()[1]}/v1"
        try:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
            with pytest.raises(openai.APIConnectionError):
                post(client(https))
            monkeypatch.setenv("SSL_CERT_FILE", cert_file)
            sdk = client(https)
            assert [post(sdk)["usage"]["prompt_tokens"] for _ in range(3)] == [7, 7, 7]
        finally:
            stop.set()
            front.close()
    assert seen["requests"] == 3 and len(seen["connections"]) == 1


def pipe_tls(tls, raw: socket.socket, port: int) -> None:
    """One client connection: TLS with it, bytes relayed both ways to the plain server."""
    try:
        conn = tls.wrap_socket(raw, server_side=True)
    except OSError:
        raw.close()
        return
    back = socket.create_connection(("127.0.0.1", port))

    def copy(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    threading.Thread(target=copy, args=(back, conn), daemon=True).start()
    copy(conn, back)


@pytest.mark.parametrize("transport", ["kept-alive", "httpx"])
def test_the_model_client_keeps_no_cookies(transport: str):
    """A model endpoint that sets a cookie never gets it back: calls carry the key, not a
    session, and the client's cookie jar is skipped for its CPU (ModelHTTPClient)."""
    seen: dict = {"cookies": []}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen["cookies"].append(self.headers.get("Cookie"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Set-Cookie", "session=abc; Path=/")
            self.send_header("Content-Length", str(len(REPLY)))
            self.end_headers()
            self.wfile.write(REPLY)

        def log_message(self, *_: object) -> None:
            pass

    with http_serving(Handler) as url:
        sdk = openai.OpenAI(
            base_url=url,
            api_key="sk-test",
            max_retries=0,
            http_client=ModelHTTPClient(transport=for_url(url, transport), timeout=10),
        )
        replies = [post(sdk) for _ in range(3)]
    assert [r["choices"][0]["message"]["content"] for r in replies] == ["4"] * 3
    assert seen["cookies"] == [None, None, None]
    assert len(sdk._client.cookies) == 0
    # The same calls through a plain httpx client send the cookie back: the test can tell.
    with http_serving(Handler) as url:
        plain = client(url)
        post(plain)
        post(plain)
    assert seen["cookies"][-1] == "session=abc"
