from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from frlm_web import redis_acl
from frlm_web.commands import FrlmCommand


class Command(FrlmCommand):
    help = (
        "Write the ACL file redis-server loads at start (`redis-server --aclfile PATH`): one "
        "Redis user per FRLM role, each password derived from SECRET_KEY, the default user "
        "off (ARCHITECTURE.md §3). What `make up` does for its own Redis, for a deployment "
        "whose supervisor starts Redis (see the Procfile). Write it again after changing "
        "FRLM_SECRET_KEY, and restart Redis."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--output",
            required=True,
            help="where to write the file (mode 0600; redis-server must be able to read it)",
        )
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print the file's path and the roles it holds as JSON",
        )

    def handle(self, *args: Any, output: str, as_json: bool, **options: Any) -> None:
        if not settings.FRLM_REDIS_ACL:
            raise CommandError(
                "FRLM_REDIS_ACL is off: this installation leaves Redis auth to its operator, "
                "so its processes would not log in as these users; unset it first"
            )
        try:
            path = redis_acl.write_acl_file(
                Path(output), settings.SECRET_KEY, events=settings.FRLM_CELERY_EVENTS
            )
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror}") from exc
        if as_json:
            self.print_json({"path": str(path.resolve()), "roles": list(redis_acl.ROLES)})
        else:
            self.stdout.write(str(path.resolve()))
