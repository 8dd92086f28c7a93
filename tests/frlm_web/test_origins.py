"""Which page may open a browser's socket (frlm_web/origins.py), without a server: the
Origin must be the site's own scheme, host and port, or a trusted origin."""

from __future__ import annotations

import pytest

from frlm_web.origins import origin_allowed


def scope(origin: str | None, host: str = "127.0.0.1:8000", **headers: str) -> dict:
    pairs = [(b"host", host.encode())]
    if origin is not None:
        pairs.append((b"origin", origin.encode()))
    pairs += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "websocket", "scheme": "ws", "headers": pairs}


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8000", "HTTP://127.0.0.1:8000/"])
def test_the_sites_own_origin_may_open_a_socket(origin):
    assert origin_allowed(scope(origin))


@pytest.mark.parametrize(
    "origin",
    [
        None,
        "",
        "null",
        "http://127.0.0.1:8001",
        "http://127.0.0.1",
        "https://127.0.0.1:8000",
        "http://localhost:8000",
        "http://127.0.0.1:8000.evil.example",
    ],
)
def test_any_other_origin_may_not(origin):
    assert not origin_allowed(scope(origin))


def test_a_host_that_is_not_allowed_is_refused_whatever_the_origin_says():
    assert not origin_allowed(scope("http://evil.example", host="evil.example"))


def test_behind_a_tls_proxy_the_origin_is_https(settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.ALLOWED_HOSTS = ["frlm.example.com"]
    proxied = {"x_forwarded_proto": "https"}
    assert origin_allowed(scope("https://frlm.example.com", "frlm.example.com", **proxied))
    assert not origin_allowed(scope("http://frlm.example.com", "frlm.example.com", **proxied))
    assert not origin_allowed(scope("https://frlm.example.com", "frlm.example.com"))


def test_a_trusted_origin_may_open_a_socket_where_a_proxy_rewrote_the_host(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://frlm.example.com", "https://*.lab.example"]
    assert origin_allowed(scope("https://frlm.example.com"))
    assert origin_allowed(scope("https://a.lab.example"))
    assert not origin_allowed(scope("http://a.lab.example"))
    assert not origin_allowed(scope("https://lab.example.evil"))
