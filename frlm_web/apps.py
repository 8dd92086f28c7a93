from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class FrlmWebConfig(AppConfig):
    name = "frlm_web"
    verbose_name = "FRLM web"

    def ready(self) -> None:
        from frlm_web.checks import secret_key_check

        checks.register(secret_key_check, checks.Tags.security)
