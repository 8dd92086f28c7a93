"""Which page may open a browser's socket: one of this site's own, as Django's CSRF check
holds a form to it.

A socket carries the session cookie of whoever is signed in, and cookies are not scoped by
port: a page served from any other port of the same host (a local service, a notebook, a
test server) is "same-site" to the browser, so it could open a signed-in user's run socket
and read the run. Channels' AllowedHostsOriginValidator let it: with allowed hosts written
without a scheme it compares host names only. So the Origin must name the very scheme, host
and port the socket was opened to (its Host header, itself an allowed host), or be one of
CSRF_TRUSTED_ORIGINS (a proxy that rewrites Host, README "Production")."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain


def _headers(scope: dict) -> dict[str, str]:
    return {
        key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]
    }


def _secure(scope: dict, headers: dict[str, str]) -> bool:
    """Whether the browser reached the site over TLS: wss itself, or a proxy that says so in
    the header settings.SECURE_PROXY_SSL_HEADER names (FRLM_HTTPS)."""
    if scope.get("scheme") == "wss":
        return True
    proxied = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if not proxied:
        return False
    name, value = proxied
    header = name.removeprefix("HTTP_").replace("_", "-").lower()
    return headers.get(header, "").split(",")[0].strip() == value


def _trusted(origin: str) -> bool:
    """Whether `origin` is one of CSRF_TRUSTED_ORIGINS ("https://*.example.com" covering
    the subdomains), as Django's CSRF middleware reads them."""
    parsed = urlsplit(origin)
    for trusted in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        if "*" not in trusted:
            if origin == trusted.lower():
                return True
            continue
        pattern = urlsplit(trusted)
        if parsed.scheme == pattern.scheme and is_same_domain(
            parsed.netloc, pattern.netloc.lstrip("*")
        ):
            return True
    return False


def origin_allowed(scope: dict) -> bool:
    """Whether a socket's handshake comes from a page of this site (module docstring). A
    handshake without an Origin is not a browser's page: refused too, as before."""
    headers = _headers(scope)
    origin = headers.get("origin", "").strip().lower().rstrip("/")
    host = headers.get("host", "").strip().lower()
    if not origin or origin == "null" or not host:
        return False
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    own = f"{'https' if _secure(scope, headers) else 'http'}://{host}"
    return origin == own or _trusted(origin)


class SameOriginValidator:
    """ASGI middleware: a websocket whose Origin is not this site's own (origin_allowed) is
    refused at the handshake (403), before any session is read."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)
