from __future__ import annotations

from django.conf import settings

from frlm_web.commands import FrlmCommand
from frlm_web.stack import running_from_pidfiles
from frlm_web.supervisor import status, status_lines


class Command(FrlmCommand):
    help = (
        "Show the processes `frlm_up` started: up or down, and how often its supervisor "
        "started each again, when last and why."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help='print it as one JSON object: {"up", "supervisor_pid", "processes": [{"name", '
            '"up", "restarts", "last_restart", "last_reason"}]}',
        )

    def handle(self, *args, as_json: bool, **options) -> None:
        state = settings.DATA_DIR / "stack"
        running = running_from_pidfiles(state)
        if as_json:
            seen = status(state, running) if running else {"supervisor_pid": None, "processes": []}
            self.print_json({"up": bool(running), **seen})
            return
        if not running:
            self.stdout.write("FRLM web is not up; `make up` starts it")
            return
        self.stdout.write("\n".join(status_lines(state, running)))
