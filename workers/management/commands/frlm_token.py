from __future__ import annotations

import argparse
from datetime import timedelta

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, number
from workers.management.arguments import venue_name
from workers.models import Venue, venue_defaults
from workers.services import token_create


class Command(FrlmCommand):
    help = (
        "Create an enrolment token with which workers join a venue "
        "(`frlm_worker --server URL --token TOKEN --venue VENUE`). The token is printed "
        "once and not kept: only its sha256 is stored."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--venue", required=True, type=venue_name, help="venue name; created if missing"
        )
        parser.add_argument(
            "--kind",
            choices=[k for k, _ in Venue.Kind.choices],
            default=None,
            help="the venue's kind when this creates it (default: from its name, else edge)",
        )
        parser.add_argument(
            "--trusted",
            action="store_true",
            help="trust the venue this creates: its workers may consume the broker, and its "
            "answers stand alone where a tier checks answers (default: untrusted, whatever "
            "its name or kind)",
        )
        parser.add_argument(
            "--ttl-hours",
            type=number(0, 24 * 366, above=True),
            default=None,
            help="expires after this many hours, at most a year (default: never)",
        )
        parser.add_argument(
            "--label",
            default="",
            type=_label,
            help="a note: who or what the token is for (at most 100 characters)",
        )
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print the token, its venue, label and expiry as one JSON object",
        )

    def handle(
        self,
        *args,
        venue: str,
        kind: str | None,
        trusted: bool,
        ttl_hours: float | None,
        label: str,
        as_json: bool,
        **_,
    ) -> None:
        # A token lets workers of other machines join: a venue it creates is trusted only
        # when asked. A typo or a new name used to make a trusted local venue (a review).
        if kind is None and venue not in Venue.Kind.values:
            kind = Venue.Kind.EDGE
        defaults = {**venue_defaults(venue, kind), "trusted": trusted}
        row, created = Venue.objects.get_or_create(name=venue, defaults=defaults)
        if trusted and not row.trusted:
            raise CommandError(
                f"venue {venue!r} exists and is not trusted; --trusted applies only to a venue "
                "this creates: trust it in the admin (/admin/workers/venue/), then run this "
                "again without --trusted"
            )
        ttl = timedelta(hours=ttl_hours) if ttl_hours else None
        token, plaintext = token_create(row, ttl=ttl, label=label)
        if as_json:
            self.print_json(
                {
                    "token": plaintext,
                    "venue": venue,
                    "venue_kind": row.kind,
                    "venue_trusted": row.trusted,
                    "venue_created": created,
                    "label": label,
                    "expires": token.expires,
                }
            )
            return
        if created:
            trust = (
                "trusted"
                if row.trusted
                # "Checked" it said, while the default tier takes every answer as it comes
                # (a review).
                else "untrusted: its workers take jobs through the gateway, and their answers "
                "are checked by runs on tier=redundant or high_trust (the default, "
                "best_effort, takes them as they come); --trusted when it creates a venue "
                "trusts it"
            )
            self.stderr.write(f"created venue {venue!r} (kind {row.kind}, {trust})")
        expires = f"expires {token.expires:%Y-%m-%d %H:%M} UTC" if token.expires else "no expiry"
        self.stderr.write(f"enrolment token for venue {venue!r} ({expires}); shown only now:")
        self.stdout.write(plaintext)


def _label(text: str) -> str:
    if len(text) > 100:
        raise argparse.ArgumentTypeError(f"takes at most 100 characters, not {len(text)}")
    return text


_label.__name__ = "label"
