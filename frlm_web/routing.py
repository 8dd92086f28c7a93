from __future__ import annotations

from django.urls import path

from runs.selectors import run_visible
from traces.consumers import RunConsumer

# The runs app tells the trace socket who may watch a run (traces imports nothing of it).
websocket_urlpatterns: list = [
    path("ws/runs/<str:run_id>", RunConsumer.as_asgi(access=run_visible)),
]
