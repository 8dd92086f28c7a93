"""The bytes under the openai client: an httpx transport over kept-alive HTTP/1.1
connections (workers/http11.py), one per thread and endpoint.

Every model call goes through the openai SDK (workers/backends.py), which builds the request,
sends the key, retries and maps errors. Under it, httpx's own transport (httpcore and h11)
spent more CPU per call than everything else a venue worker does for a sub-query: a worker
makes thousands of small calls a second to one endpoint, and its CPU per sub-query is what
bounds a fanout on a shared machine (bench/modelcall.py measures both, side by side). The SDK
takes any httpx transport (`http_client=httpx.Client(transport=...)`); this one sends the
request's own method, target, headers and body as they are, and hands back the status,
headers and raw body for httpx to decode, so what the SDK sees is unchanged.

What it does not do, and where httpx's own transport is used instead (`for_url`): proxies
(an endpoint the environment routes through HTTP(S)_PROXY), and streamed replies, which it
reads whole (the product never streams a model's reply). FRLM_MODEL_TRANSPORT=httpx goes
back to httpx's transport everywhere."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import threading
import urllib.request
import weakref
from urllib.parse import urlsplit

import httpx

from workers import http11
from workers.ahttp11 import AsyncConnection


def _timeouts(request: httpx.Request) -> tuple[float | None, float | None]:
    """The connect and read timeouts the client set on this request."""
    asked = request.extensions.get("timeout") or {}
    return asked.get("connect"), asked.get("read")


class KeptAliveTransport(httpx.BaseTransport):
    """An httpx transport over one HTTP/1.1 connection per thread and endpoint, kept
    alive between requests. A connection the server closed while it was idle is opened
    again once for the same request (that is not a failure of the endpoint); any other
    failure is raised as the httpx error the SDK maps (a timeout, a refused or broken
    connection)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: set[http11.Connection] = set()  # open ones, to close at the end
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        _KEPT.add(self)

    def close_thread(self) -> None:
        """Close the calling thread's connections, for a thread about to end: `_all` holds
        them, so a thread made per call (a root model's turn, runs/engine/turns.py) left one
        open socket behind each time (a review)."""
        pool = getattr(self._local, "pool", None)
        if not pool:
            return
        self._local.pool = {}
        with self._lock:
            for conn in pool.values():
                self._all.discard(conn)
        for conn in pool.values():
            conn.close()

    def _tls(self) -> ssl.SSLContext:
        """The certificates httpx itself would trust (certifi's bundle, or SSL_CERT_FILE /
        SSL_CERT_DIR when set), made once: a machine without a system CA store still
        reaches a public endpoint."""
        if self._context is None:
            self._context = httpx.create_ssl_context()
        return self._context

    def _pool(self) -> dict[tuple[str, str, int], http11.Connection]:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = {}
        return pool

    def _connection(self, url: httpx.URL) -> http11.Connection:
        key = _endpoint(url)
        pool = self._pool()
        conn = pool.get(key)
        if conn is None:
            tls = self._tls() if url.scheme == "https" else None
            conn = pool[key] = http11.Connection(url.host, key[2], tls)
            with self._lock:
                self._all.add(conn)
        return conn

    def _drop(self, url: httpx.URL) -> None:
        conn = self._pool().pop(_endpoint(url), None)
        if conn is not None:
            conn.close()
            with self._lock:
                self._all.discard(conn)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        connect_s, read_s = _timeouts(request)
        url = request.url
        target = url.raw_path.decode("ascii")
        body = request.read()
        for fresh in (False, True):
            conn = self._connection(url)
            reused = not fresh and conn.sock is not None
            try:
                if conn.sock is None:
                    conn.open(connect_s)
                reply = conn.exchange(request.method, target, request.headers.raw, body, read_s)
            except _FAILURES as exc:
                connected = conn.sock is not None
                self._drop(url)
                if reused and isinstance(exc, _IDLE_CLOSED):
                    continue  # the server closed the idle connection: open it again, once
                raise _failure(exc, request, connected) from exc
            if reply.will_close:
                self._drop(url)
            return _response(reply, request)
        raise AssertionError("unreachable")  # the loop returns or raises

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, set()
        for conn in conns:
            conn.close()


_KEPT: weakref.WeakSet[KeptAliveTransport] = weakref.WeakSet()


def close_thread_connections() -> None:
    """Close the calling thread's kept-alive connections, on every transport."""
    for transport in list(_KEPT):
        transport.close_thread()


# A request on a kept connection that the server had closed while it was idle.
_IDLE_CLOSED = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
_FAILURES = (OSError, http.client.HTTPException)  # TimeoutError is an OSError


def _failure(exc: BaseException, request: httpx.Request, connected: bool) -> httpx.HTTPError:
    """The httpx error the SDK maps for a failed exchange: a broken or refused connection,
    a timeout, a reply that is not HTTP."""
    if isinstance(exc, _IDLE_CLOSED):
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, TimeoutError):
        kind = httpx.ReadTimeout if connected else httpx.ConnectTimeout
        return kind(str(exc) or "timed out", request=request)
    kind = httpx.ReadError if connected else httpx.ConnectError
    return kind(str(exc) or type(exc).__name__, request=request)


def _response(reply: http11.Reply, request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        reply.status,
        headers=reply.headers,
        stream=httpx.ByteStream(reply.content),
        extensions={"http_version": b"HTTP/1.1"},
        request=request,
    )


def _endpoint(url: httpx.URL) -> tuple[str, str, int]:
    return (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))


class AsyncKeptAliveTransport(httpx.AsyncBaseTransport):
    """The same for an asyncio worker (workers/aslots.py): its connections, kept alive
    between requests, are shared by the loop's tasks, one request at a time each; a task
    takes an idle one or opens another. Bound to the event loop that first uses it."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[AsyncConnection]] = {}
        self._all: set[AsyncConnection] = set()
        self._context: ssl.SSLContext | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        connect_s, read_s = _timeouts(request)
        url = request.url
        key = _endpoint(url)
        target = url.raw_path.decode("ascii")
        body = await request.aread()
        for fresh in (False, True):
            idle = self._idle.setdefault(key, [])
            if idle and not fresh:
                conn, reused = idle.pop(), True
            else:
                if self._context is None and url.scheme == "https":
                    self._context = httpx.create_ssl_context()
                conn, reused = AsyncConnection(url.host, key[2], self._context), False
                self._all.add(conn)
            try:
                if not conn.open_:
                    await conn.open(connect_s)
                reply = await conn.exchange(
                    request.method, target, request.headers.raw, body, read_s
                )
            except (*_FAILURES, asyncio.CancelledError) as exc:
                connected = conn.open_
                conn.close()
                self._all.discard(conn)
                if isinstance(exc, asyncio.CancelledError):
                    raise  # the caller gave up: a half-read reply leaves nothing to reuse
                if reused and isinstance(exc, _IDLE_CLOSED):
                    continue  # the server closed the idle connection: open it again, once
                raise _failure(exc, request, connected) from exc
            if reply.will_close:
                conn.close()
                self._all.discard(conn)
            else:
                idle.append(conn)
            return _response(reply, request)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def aclose(self) -> None:
        conns, self._all, self._idle = self._all, set(), {}
        for conn in conns:
            conn.close()


def _proxied(base_url: str) -> bool:
    """Whether the environment sends requests to this endpoint through a proxy."""
    host = urlsplit(base_url).hostname or ""
    proxies = urllib.request.getproxies_environment()
    scheme = urlsplit(base_url).scheme
    return bool(proxies.get(scheme) or proxies.get("all")) and not (
        urllib.request.proxy_bypass_environment(host, proxies)
    )


def for_url(base_url: str, setting: str = "kept-alive") -> httpx.BaseTransport | None:
    """The transport for an endpoint: this one, or None (httpx's own) where a proxy is set
    or the setting (FRLM_MODEL_TRANSPORT) asks for httpx's."""
    if setting == "httpx" or _proxied(base_url):
        return None
    if not base_url.startswith(("http://", "https://")):
        return None
    return KeptAliveTransport()


def for_url_async(base_url: str, setting: str = "kept-alive") -> httpx.AsyncBaseTransport | None:
    """The same for an asyncio worker's client."""
    if for_url(base_url, setting) is None:
        return None
    return AsyncKeptAliveTransport()


class _NoCookies(httpx.Cookies):
    """A jar that takes nothing and sends nothing: it stays empty, so one serves every
    client."""

    def extract_cookies(self, response: httpx.Response) -> None:
        pass

    def set_cookie_header(self, request: httpx.Request) -> None:
        pass

    def set(self, *_args: object, **_kwargs: object) -> None:
        pass


_NO_COOKIES = _NoCookies()


class ModelHTTPClient(httpx.Client):
    """The httpx client under the openai SDK for model calls: it keeps no cookies. A model
    API authenticates with its key, not a session, and httpx reads every reply's headers
    into a cookie jar through urllib's cookie machinery: 12% of the CPU of an SDK call to
    the simulated model (bench/modelcall.py). A Set-Cookie from the endpoint is ignored and
    no Cookie header is ever sent."""

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES  # read twice per call: not a new jar each time

    @cookies.setter
    def cookies(self, _value: object) -> None:
        pass  # nothing to keep


class AsyncModelHTTPClient(httpx.AsyncClient):
    """ModelHTTPClient's twin under the SDK's AsyncOpenAI: no cookie jar either."""

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, _value: object) -> None:
        pass
