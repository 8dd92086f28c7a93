"""The queue bindings Celery declares for a broker worker go with the worker: at its
deregistration, and in the sweep a conductor makes when it starts (workers/services.py)."""

from __future__ import annotations

import pytest
import redis

from frlm_web.redis_client import get_redis
from workers.models import Venue, Worker
from workers.services import departed_bindings_sweep, queue_bindings_forget, worker_deregister

pytestmark = [pytest.mark.stack]


def bind(client: redis.Redis, worker_id: str) -> list[str]:
    """The two sets kombu's Redis transport keeps for a worker's own queue."""
    queue = f"worker.{worker_id}"
    keys = [f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]
    for key in keys:
        client.sadd(key, f"{queue}\x06\x16\x06\x16{queue}")
    return keys


def test_a_departed_workers_bindings_go_and_an_active_ones_stay(stack, transactional_db):
    client = get_redis()
    venue = Venue.objects.create(name="bindings", kind="edge")
    active, leaving, lost = (
        Worker.objects.create(name=name, venue=venue, public_key="k" * 44)
        for name in ("active", "leaving", "lost")
    )
    Worker.objects.filter(id=lost.id).update(status=Worker.Status.LOST)
    held = {w.id: bind(client, w.id) for w in (active, leaving, lost)}
    unknown = bind(client, "w0000deadbeef")  # a worker of a database since wiped
    # Their own queues too, with jobs left in them (a review found 16 held for good), and
    # a gateway worker's, which has no bindings.
    gone_gateway = "w0000feedface"
    for wid in (active.id, leaving.id, lost.id, "w0000deadbeef", gone_gateway):
        client.rpush(f"worker.{wid}", "a job")
    held[active.id].append(f"worker.{active.id}")
    held[leaving.id].append(f"worker.{leaving.id}")
    held[lost.id].append(f"worker.{lost.id}")
    unknown += ["worker.w0000deadbeef", f"worker.{gone_gateway}"]
    try:
        worker_deregister(leaving)
        assert client.exists(*held[leaving.id]) == 0
        assert client.exists(*held[lost.id], *unknown) == 7
        assert departed_bindings_sweep(client) >= 3
        assert client.exists(*held[lost.id], *unknown) == 0
        assert client.exists(*held[active.id]) == 3
    finally:
        client.delete(*[key for keys in held.values() for key in keys], *unknown)


def test_a_trusted_workers_role_cannot_drop_them_and_does_not_fail_for_it(stack):
    admin = get_redis()
    keys = bind(admin, "w00000000feed")
    worker = redis.Redis.from_url(stack.role_url("worker"))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.delete(*keys)
        queue_bindings_forget(worker, ["w00000000feed"])  # left for the next sweep
        assert admin.exists(*keys) == 2
    finally:
        admin.delete(*keys)
        worker.close()
