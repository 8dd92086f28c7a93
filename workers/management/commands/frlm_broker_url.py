from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError

from frlm_web import redis_acl
from frlm_web.commands import FrlmCommand
from workers.models import Venue


class Command(FrlmCommand):
    help = (
        "Print the Redis URL a worker of a trusted venue uses to consume Celery directly "
        "(FRLM_REDIS_URL=... manage.py frlm_worker --server URL --token TOKEN --venue VENUE "
        "--connect broker). "
        "It names the `worker` Redis user, which takes jobs and delivers results but cannot "
        "read other runs' events or touch reputation, strikes, breakers or budgets. Workers "
        "of untrusted venues get no broker access at all."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--venue", required=True, help="a trusted venue's name")

    def handle(self, *args, venue: str, **_) -> None:
        row = Venue.objects.filter(name=venue).first()
        if row is None:
            raise CommandError(f"no venue {venue!r}: create it with `manage.py frlm_token`")
        if not row.trusted:
            raise CommandError(
                f"venue {venue!r} is not trusted: its workers get no access to the broker. "
                "Mark it trusted (admin, venues) only if you run its machines yourself"
            )
        base = settings.FRLM_REDIS_URL
        if not settings.FRLM_REDIS_ACL or redis_acl.has_credentials(base):
            raise CommandError(
                "this server's Redis has no FRLM users (FRLM_REDIS_ACL is off, or "
                "FRLM_REDIS_URL carries credentials of its own): give the worker a Redis "
                "user of your own, with the rights of the `worker` role in "
                "frlm_web/redis_acl.py"
            )
        self.stderr.write(
            f"the Redis URL for workers of venue {venue!r}; keep it secret. The host must be "
            "one the worker's machine reaches (redis-server binds where the stack told it)."
        )
        self.stdout.write(redis_acl.role_url(base, "worker", settings.SECRET_KEY))
