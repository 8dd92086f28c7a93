"""POST a JSON body to an OpenAI-compatible endpoint over a kept-alive connection: the one
HTTP client of `workers/backends.py`.

A venue worker makes thousands of small calls a second to one endpoint. The openai SDK's
request building, and httpx's under it, cost 1.2-3 ms of CPU per call, more than the rest of
the sub-query; `http.client` over one connection per thread and endpoint costs a fraction of
it. What the SDK did that a worker relies on is kept here: the bearer key, retries of
connection failures, 408/409/429 and 5xx answers with exponential backoff (honouring a short
Retry-After), and errors that say which kind of failure it was."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from typing import Any

RETRY_STATUSES = frozenset({408, 409, 429})
MAX_BACKOFF_S = 8.0
RETRY_HEADER = "x-frlm-retry-count"  # the endpoint's logs tell retries from new requests


class Unreachable(Exception):
    """No answer: refused, reset, timed out."""


class StatusError(Exception):
    def __init__(self, status: int, body: Any, text: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.text = status, body, text


class Garbage(Exception):
    """An answer that is not JSON."""


_local = threading.local()


def _connection(scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
    pool: dict[tuple[str, str], http.client.HTTPConnection] = _local.__dict__.setdefault("pool", {})
    conn = pool.get((scheme, netloc))
    if conn is None:
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = pool[(scheme, netloc)] = kind(netloc, timeout=timeout)
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    return conn


def _drop(scheme: str, netloc: str) -> None:
    conn = _local.__dict__.get("pool", {}).pop((scheme, netloc), None)
    if conn is not None:
        conn.close()


def _once(
    url: urllib.parse.SplitResult, path: str, data: bytes, headers: dict[str, str], timeout: float
) -> tuple[int, bytes, str | None]:
    """One request; a kept-alive connection the server closed meanwhile is opened again once
    (that is not a failure of the endpoint, so it is not a retry)."""
    for fresh in (False, True):
        reused = not fresh and (url.scheme, url.netloc) in _local.__dict__.get("pool", {})
        conn = _connection(url.scheme, url.netloc, timeout)
        try:
            conn.request("POST", path, body=data, headers=headers)
            response = conn.getresponse()
            body = response.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            _drop(url.scheme, url.netloc)
            if reused:
                continue
            raise Unreachable(str(exc) or type(exc).__name__) from exc
        except (OSError, http.client.HTTPException) as exc:
            _drop(url.scheme, url.netloc)
            raise Unreachable(str(exc) or type(exc).__name__) from exc
        if response.will_close:
            _drop(url.scheme, url.netloc)
        return response.status, body, response.getheader("retry-after")
    raise AssertionError("unreachable")  # the loop returns or raises


def _backoff(retry: int, retry_after: str | None) -> float:
    try:
        asked = float(retry_after) if retry_after else None
    except ValueError:
        asked = None
    if asked is not None and 0 <= asked <= 60:
        return asked
    return min(0.5 * 2**retry, MAX_BACKOFF_S) * (1 - 0.25 * random.random())  # noqa: S311


def post_json(
    base_url: str, path: str, body: dict[str, Any], *, api_key: str, timeout: float, retries: int
) -> Any:
    """The decoded JSON answer of POST base_url + path; raises Unreachable, StatusError (after
    the retries) or Garbage."""
    url = urllib.parse.urlsplit(base_url.rstrip("/") + path)
    data = json.dumps(body).encode()
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": f"Bearer {api_key}",
    }
    target = url.path + (f"?{url.query}" if url.query else "")
    for retry in range(retries + 1):
        if retry:
            headers[RETRY_HEADER] = str(retry)
        try:
            status, raw, retry_after = _once(url, target, data, headers, timeout)
        except Unreachable:
            if retry == retries:
                raise
            time.sleep(_backoff(retry, None))
            continue
        if status < 300:
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise Garbage(f"{exc}: {raw[:120]!r}") from exc
        if retry < retries and (status in RETRY_STATUSES or status >= 500):
            time.sleep(_backoff(retry, retry_after))
            continue
        text = raw.decode("utf-8", "replace")
        try:
            decoded: Any = json.loads(text)
        except ValueError:
            decoded = None
        raise StatusError(status, decoded, text)
    raise AssertionError("unreachable")  # the loop returns or raises
