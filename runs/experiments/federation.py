"""The federation a suite describes, brought up for the length of the suite.

Runs of a suite are ordinary runs in the product's database, so the suite uses the stack
its settings point at: when a conductor is already live there (`make up`, the web console's
stack, the test session's stack), only the suite's venues are started beside it, as swarms
of simulated devices, and its model server, recorder and conductor serve them; the runs
then show on /runs/ as they happen, and replay and diff work on them. When nothing is
running, the whole stack is started (Redis if it is down, the model server, the recorder,
a conductor) and stopped at the end, so the command also works on a bare checkout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings

from frlm_web import presence
from frlm_web.redis_client import get_redis
from frlm_web.stack import Proc, Stack, VenueSpec
from runs.experiments.suite import Suite, SuiteError, profile_toml
from runs.orphans import CONDUCTOR_GROUP
from workers.models import Venue, venue_defaults
from workers.venues import live_workers

# How long each process may take to come up: worker processes start slowly on a busy
# machine, and a swarm's devices all start at once.
START_TIMEOUT_S = 300.0


class SuiteStack(Stack):
    """A stack whose swarms count as up once one device of each is live: a churning swarm
    may never have all its devices up at once, and the rest join as they start."""

    def venue_proc(self, venue: VenueSpec) -> Proc:
        proc = super().venue_proc(venue)
        group = f"venue:{venue.name}"
        proc.ready = lambda: bool(presence.alive(self.client, group))
        return proc


class VenuesOnly(SuiteStack):
    """The suite's venues, served by a stack that is already running."""

    def plan(self) -> list[Proc]:
        return [self.venue_proc(venue) for venue in self.venues]


def venue_specs(suite: Suite, folder: Path) -> list[VenueSpec]:
    """A swarm per venue; a profile given in the suite is written to `folder` first."""
    folder.mkdir(parents=True, exist_ok=True)
    specs = []
    for venue in suite.venues:
        profile = venue.profile
        if venue.inline:
            # Named after its venue: the report draws the same devices (workers.swarm.devices
            # seeds them with the profile's name) to know which of them lied.
            path = folder / f"{venue.name}.toml"
            path.write_text(profile_toml(venue.inline, venue.name))
            profile = str(path)
        specs.append(VenueSpec(venue.name, swarm=profile, workers=venue.workers))
    return specs


def register_venues(suite: Suite) -> None:
    """Each venue as a row, trusted as the suite says; an existing venue whose trust differs
    is refused rather than changed: a suite does not decide who is trusted in a live
    deployment."""
    for venue in suite.venues:
        defaults = {**venue_defaults(venue.name), "trusted": venue.trusted}
        row, _ = Venue.objects.get_or_create(name=venue.name, defaults=defaults)
        if row.trusted != venue.trusted:
            raise SuiteError(
                f"venue {venue.name} exists and is {'' if row.trusted else 'not '}trusted, "
                f"but the suite says trusted={str(venue.trusted).lower()}: rename the venue "
                "in the suite or change its trust on the venues page"
            )


def stack_running() -> bool:
    """Whether a conductor is live on the configured Redis: asked once, without riding out
    an outage (a Redis that is not there is the common case on a bare checkout)."""
    try:
        client = get_redis(ride_out=False)
        return bool(presence.alive(client, CONDUCTOR_GROUP))
    except redis.RedisError:
        return False


@contextmanager
def federation(suite: Suite, folder: Path) -> Iterator[Stack]:
    """1. register the venues, 2. check none of them has workers already (they would mix
    with the suite's), 3. start the venues (and the stack, when none runs), 4. stop what
    was started, whatever happens."""
    register_venues(suite)
    running = stack_running()
    if running:
        busy = [v.name for v in suite.venues if live_workers(get_redis(), v.name)]
        if busy:
            raise SuiteError(
                f"venue {busy[0]} already has live workers; a suite brings its own: rename "
                "the venue in the suite or stop those workers"
            )
    env = {
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DB_PATH": str(settings.DATABASES["default"]["NAME"]),
    }
    kind = VenuesOnly if running else SuiteStack
    stack = kind(
        state_dir=folder / "stack",
        venues=venue_specs(suite, folder / "profiles"),
        env=env,
        start_redis=None if not running else False,
        redis_persist=False,
    )
    try:
        stack.start(timeout=START_TIMEOUT_S)
        yield stack
    finally:
        stack.stop()
