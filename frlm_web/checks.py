"""Refusals at start: with DEBUG off, nothing serves or conducts on a published secret key.
manage.py commands meet it as a system check (an error stops runserver, the conductor, the
workers, migrate); daphne, which runs no checks, when it loads frlm_web/asgi.py."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from frlm_web import secret


def secret_key_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    why = secret.refusal(settings.SECRET_KEY, settings.DEBUG)
    return [checks.Error(why, id="frlm.E001")] if why else []


def refuse_to_serve() -> None:
    why = secret.refusal(settings.SECRET_KEY, settings.DEBUG)
    if why:
        raise ImproperlyConfigured(why)
