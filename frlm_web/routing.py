from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from runs.selectors import run_context_path, run_visible
from traces.consumers import RunConsumer
from workers.gateway.server import GatewayConsumer


def browser(app: Any) -> Any:
    """A socket a browser opens: its Origin must be an allowed host, and it carries the
    signed-in session."""
    return AllowedHostsOriginValidator(AuthMiddlewareStack(app))


# The runs app tells the trace socket who may watch a run, and the gateway which file is a
# run's context (traces and workers import nothing of it).
websocket_urlpatterns: list = [
    path("ws/runs/<str:run_id>", browser(RunConsumer.as_asgi(access=run_visible))),
    # A machine client: no session and no Origin; the worker proves who it is by signing
    # a challenge with its key (workers/gateway/server.py).
    path("ws/workers/gateway", GatewayConsumer.as_asgi(run_context=run_context_path)),
]
