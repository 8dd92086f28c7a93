"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "frlm_web.settings")
# Django must be set up before anything imports models (consumers do).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from frlm_web import collector  # noqa: E402
from frlm_web.checks import refuse_to_serve  # noqa: E402
from frlm_web.routing import websocket_urlpatterns  # noqa: E402
from frlm_web.static_files import StaticFiles  # noqa: E402

# daphne runs no system checks: the refusal they would give is given here.
refuse_to_serve()

# The URLconf imports every view and, through them, the model clients (the openai SDK
# alone is seconds of imports on a busy machine). Loaded here, before daphne listens, that
# cost is part of starting; loaded by the first request, it was that request's, and a
# worker registering first timed out (seen under load: "could not register: timed out").
get_resolver().url_patterns  # noqa: B018

if settings.FRLM_LEASE_WATCH:
    # The web server is up whenever the product is: it fails the runs of a conductor that
    # died, even the only one (runs/lease.py).
    from runs.lease import watch_start  # noqa: E402

    watch_start("web")

# Everything the server loaded to start is frozen out of the cycle collector's walks
# (frlm_web/collector.py): a full collection stopped every page, socket and gateway
# worker's relay for as long as it walked Django and the libraries.
collector.settle()

application = ProtocolTypeRouter(
    {
        # daphne serves no files itself. StaticFiles answers /static/ from the finders
        # (static/ and the apps' own, such as the admin's) with DEBUG off as well, so there
        # is no collectstatic step to forget: from memory, gzipped, 304 when current.
        "http": StaticFiles(django_asgi_app),
        # Each route brings its own checks (frlm_web/routing.py): browsers' sockets an
        # origin check and the session, the workers' gateway a signed challenge.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
