from __future__ import annotations

from django.conf import settings

from frlm_web.commands import FrlmCommand
from frlm_web.stack import running_from_pidfiles
from frlm_web.supervisor import status_lines


class Command(FrlmCommand):
    help = (
        "Show the processes `frlm_up` started: up or down, and how often its supervisor "
        "started each again, when last and why."
    )

    def handle(self, *args, **options) -> None:
        state = settings.DATA_DIR / "stack"
        running = running_from_pidfiles(state)
        if not running:
            self.stdout.write("FRLM web is not up; `make up` starts it")
            return
        self.stdout.write("\n".join(status_lines(state, running)))
