from __future__ import annotations

from django.conf import settings

from frlm_web.commands import FrlmCommand
from frlm_web.stack import stop_from_pidfiles


class Command(FrlmCommand):
    help = "Stop the processes `frlm_up` started."

    def handle(self, *args, **options) -> None:
        stopped = stop_from_pidfiles(settings.DATA_DIR / "stack")
        if stopped:
            self.stdout.write(f"stopped: {', '.join(sorted(stopped))}")
        else:
            self.stdout.write("nothing was running")
