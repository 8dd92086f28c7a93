from __future__ import annotations

from frlm_web.celery import app as celery_app

__all__ = ["celery_app"]
