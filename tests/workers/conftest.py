"""Fixtures of the worker API tests: a venue, a token of it, and the per-address failure
counts cleared around each test (they live in Redis, which outlives each test); gateway
workers of venue `far` for the gateway's tests."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from frlm_web.redis_client import get_redis
from tests.gateway import GatewayWorker
from workers.models import Venue
from workers.services import token_create


@pytest.fixture
def venue(transactional_db) -> Venue:
    # Presence lives in Redis, which outlives each test's database.
    for name in ("apitest", "apitest2"):
        get_redis().delete(f"frlm:presence:venue:{name}", f"frlm:presence:venue:{name}:info")
    return Venue.objects.create(name="apitest", kind="edge")


@pytest.fixture
def token(venue: Venue) -> str:
    return token_create(venue, ttl=timedelta(hours=1), label="test")[1]


@pytest.fixture
def api_failures_cleared(stack) -> Iterator[None]:
    """No address or worker starts throttled, and none leaves throttled for the next test
    (the stack's own web server counts in the same Redis)."""

    def clear() -> None:
        client = get_redis()
        for pattern in ("frlm:api:fail:*", "frlm:api:beat:*"):
            for key in client.scan_iter(pattern):
                client.delete(key)

    clear()
    yield
    clear()


@pytest.fixture
def far(web, venues, tmp_path):
    """Start gateway workers of venue `far` for one test; they stop after it."""
    started: list[GatewayWorker] = []

    def start(name: str, *flags: str) -> GatewayWorker:
        worker = GatewayWorker(web, "far", name, tmp_path, "--concurrency", "4", *flags)
        started.append(worker)
        worker.wait_up()
        return worker

    yield start
    for worker in started:
        worker.kill()
