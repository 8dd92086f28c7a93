"""Redis users per role (frlm_web/redis_acl.py), against the stack's real redis-server: each
test connects with the credentials a process of the stack was actually given (read from
its environment), and tries what that process should or should not be able to do."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from frlm_web.stack import Stack
from tests.helpers import finish, launch, scripted
from traces.emitter import EVENTS_STREAM, Emitter
from workers.circuit import circuit_key
from workers.jobs import cancelled_key, results_stream
from workers.reputation import strikes_key

NOPERM = redis.exceptions.NoPermissionError


def given_url(stack: Stack, proc: str) -> str:
    """The Redis URL the stack handed one of its processes."""
    popen = stack.procs[proc].popen
    assert popen is not None
    environ = Path(f"/proc/{popen.pid}/environ").read_bytes().split(b"\0")
    found = [v for v in environ if v.startswith(b"FRLM_REDIS_URL=")]
    assert found, f"{proc} was started without FRLM_REDIS_URL"
    return found[0].split(b"=", 1)[1].decode()


@pytest.fixture
def worker_redis(stack: Stack) -> redis.Redis:
    """Connected as the stack's `local` venue worker, a trusted one."""
    worker = next(name for name in stack.procs if name.startswith("worker-local"))
    client = redis.Redis.from_url(given_url(stack, worker))
    client.ping()
    return client


def test_it_refuses_the_default_user(stack: Stack) -> None:
    parts = urlsplit(stack.redis_url)
    anonymous = redis.Redis(host=parts.hostname, port=parts.port)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with pytest.raises(redis.AuthenticationError):
        anonymous.set("frlm:rep:w1", "1")


def test_it_gives_the_worker_its_own_credentials_and_not_the_servers_secret(stack: Stack) -> None:
    worker = next(name for name in stack.procs if name.startswith("worker-local"))
    assert urlsplit(given_url(stack, worker)).username == "worker"
    environ = Path(f"/proc/{stack.procs[worker].popen.pid}/environ").read_bytes()
    assert b"FRLM_SECRET_KEY=" not in environ


@pytest.mark.parametrize(
    "attempt",
    [
        pytest.param(lambda c: c.hset("frlm:rep:w1", "ok", 99), id="raise-reputation"),
        pytest.param(lambda c: c.delete("frlm:rep:w1"), id="reset-reputation"),
        pytest.param(lambda c: c.delete(strikes_key("w1")), id="clear-strikes"),
        pytest.param(lambda c: c.set(strikes_key("w1"), 0), id="zero-strikes"),
        pytest.param(lambda c: c.delete(circuit_key("worker:w1")), id="close-breaker"),
        pytest.param(lambda c: c.hset(circuit_key("venue:edge"), "state", "closed"), id="breaker"),
        pytest.param(lambda c: c.set("frlm:budget:r1", 0), id="budget"),
        # It may set its own presence bar (SET on the bar keys alone), nothing else there.
        pytest.param(lambda c: c.set("frlm:presence:venue:edge", "x"), id="clobber-presence"),
        pytest.param(lambda c: c.set("frlm:api:sig:x", 1), id="replay-cache"),
        pytest.param(lambda c: c.get("frlm:run:r1:progress"), id="read-progress"),
        pytest.param(lambda c: c.set("frlm:run:r1:cancel", 1), id="cancel-a-run"),
        pytest.param(lambda c: c.xread({EVENTS_STREAM: "0"}), id="read-every-prompt"),
        pytest.param(lambda c: c.xrange(EVENTS_STREAM), id="range-every-prompt"),
        pytest.param(lambda c: c.xrange(results_stream("r1")), id="read-results"),
        pytest.param(lambda c: c.sadd(cancelled_key("r1"), "sq1"), id="cancel-jobs"),
        pytest.param(lambda c: c.keys("*"), id="list-keys"),
        pytest.param(lambda c: c.lrange("venue.edge", 0, -1), id="peek-queued-prompts"),
        pytest.param(lambda c: c.publish("/0.celery.pidbox", "shutdown"), id="remote-control"),
        pytest.param(lambda c: c.publish("/0.celeryev/task.succeeded", "{}"), id="fake-events"),
        pytest.param(lambda c: c.flushall(), id="flush"),
        pytest.param(lambda c: c.config_get("*"), id="config"),
        pytest.param(lambda c: c.acl_list(), id="acl"),
    ],
)
def test_it_refuses_a_trusted_worker_what_is_not_its_job(worker_redis: redis.Redis, attempt):
    with pytest.raises(NOPERM):
        attempt(worker_redis)


def test_it_lets_a_trusted_worker_do_its_job(worker_redis: redis.Redis, stack: Stack) -> None:
    stack.client.sadd(cancelled_key("racl"), "sq-gone")
    assert worker_redis.sismember(cancelled_key("racl"), "sq-gone")
    worker_redis.xadd(results_stream("racl"), {"r": "{}"})
    Emitter(worker_redis, "racl", venue="local").instant("Env.LoadFragment", depth=0)
    assert stack.client.xlen(results_stream("racl")) == 1
    stack.client.delete(cancelled_key("racl"), results_stream("racl"))


def test_it_runs_a_whole_run_with_no_process_refused_anything(stack: Stack, venues) -> None:
    stack.client.acl_log_reset()
    run = finish(
        launch(
            question=scripted(
                "rs = llm_query_batched(['ask %d' % i for i in range(8)])",
                "FINAL(str(len(rs)))",
            ),
            policy={"tier": "redundant", "replicas": 2, "agree": 2},
        )
    )
    assert (run.status, run.answer) == ("succeeded", "8"), run.error
    refused = [
        {k: entry.get(k) for k in ("username", "reason", "object")}
        for entry in stack.client.acl_log()
    ]
    assert refused == []


def test_it_leaves_a_url_with_credentials_of_its_own_alone() -> None:
    from frlm_web.redis_acl import role_url

    external = "redis://ops:s3cret@redis.internal:6380/2"
    assert role_url(external, "worker", "k") == external
    assert urlsplit(role_url("redis://h:1/0", "web", "k")).username == "web"
    assert role_url("redis://h:1/0", "web", "k") != role_url("redis://h:1/0", "web", "other")
