"""The Celery application is `frlm_web.celery.app` (what `celery -A frlm_web` finds as
`celery_app`). It is loaded when first asked for, not with the package: every
`manage.py` command imports this package, and most never send or run a task."""

from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from frlm_web.celery import app

        return app
    raise AttributeError(f"module 'frlm_web' has no attribute {name!r}")
