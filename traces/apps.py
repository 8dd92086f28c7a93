from __future__ import annotations

from django.apps import AppConfig


class TracesConfig(AppConfig):
    name = "traces"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from traces.sessions import close_sessions_sockets

        # Signing out closes the run sockets the session opened.
        user_logged_out.connect(close_sessions_sockets, dispatch_uid="traces.close_sockets")
