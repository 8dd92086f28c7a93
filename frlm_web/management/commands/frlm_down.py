from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from frlm_web.stack import stop_from_pidfiles


class Command(BaseCommand):
    help = "Stop the processes `frlm_up` started."

    def handle(self, *args, **options) -> None:
        stopped = stop_from_pidfiles(settings.DATA_DIR / "stack")
        if stopped:
            self.stdout.write(f"stopped: {', '.join(sorted(stopped))}")
        else:
            self.stdout.write("nothing was running")
