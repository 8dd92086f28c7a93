from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from frlm_web.origins import SameOriginValidator
from runs.selectors import run_context_path, run_visible
from traces.consumers import RunConsumer
from workers.gateway.handshake import GatewayConsumer


def browser(app: Any) -> Any:
    """A socket a browser opens: its Origin must be this site's own (scheme, host and
    port: frlm_web/origins.py), and it carries the signed-in session."""
    return SameOriginValidator(AuthMiddlewareStack(app))


# A socket to a path no route serves.
CLOSE_NO_ROUTE = 4404


class NoRoute(AsyncWebsocketConsumer):
    """Any other path: accepted only to be closed with 4404, so the client learns why (a
    refused handshake reaches a browser as 1006), and the server logs no error for it."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NO_ROUTE)


# The runs app tells the trace socket who may watch a run, and the gateway which file is a
# run's context (traces and workers import nothing of it).
websocket_urlpatterns: list = [
    path("ws/runs/<str:run_id>", browser(RunConsumer.as_asgi(access=run_visible))),
    # A machine client: no session and no Origin; the worker proves who it is by signing
    # a challenge with its key (workers/gateway/handshake.py).
    path("ws/workers/gateway", GatewayConsumer.as_asgi(run_context=run_context_path)),
    re_path(r"", NoRoute.as_asgi()),
]
