"""Redis users per role, least privilege (ARCHITECTURE.md §3).

Every process of the stack talks to Redis as the user of its role, and each role may touch
only the keys, commands and channels its code needs: a trusted venue worker, which
consumes Celery directly, can take jobs and deliver results but cannot read other runs'
events, write reputation, strikes or breakers, or send remote-control commands to the
other Celery workers. The default user is off.

A role's password is HMAC-SHA256(SECRET_KEY, "frlm-redis:<role>"): processes that hold the
server's secret derive their own, nothing has to be stored or handed around between
them, and the ACL file the stack writes holds only the passwords' sha256. A worker on
another machine holds no SECRET_KEY: the operator gives it its role's URL
(`manage.py frlm_broker_url --venue V`, trusted venues only).

Pure functions over strings: settings import this module, so it imports nothing of Django.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

# Celery's queues as kombu's Redis transport keeps them: a list per queue (and one per
# priority step, the name followed by "\x06\x16<n>": hence the trailing *), the exchange
# bindings in `_kombu.binding.<exchange>` and `_kombu.binding_permanent.<exchange>`, the
# messages delivered but not yet acknowledged in `unacked` / `unacked_index` /
# `unacked_mutex` (ack emulation, the conductor's `runs`).
_CELERY_RUNS = "~runs* ~_kombu.binding* ~unacked ~unacked_index ~unacked_mutex"
_CELERY_WORKER_QUEUES = "~worker.* ~venue.*"
# Remote control (revoke, shutdown, pool restarts) is a fanout exchange, carried by Redis
# pub/sub on "/<db>.celery.pidbox". Consumers PSUBSCRIBE to that name, and a PSUBSCRIBE
# passes the ACL only when its pattern is literally an allowed one: hence one per database.
# Each consumer also declares a queue `<name>@<host>.celery.pidbox` (its length is read and
# its expiry refreshed; its messages come by pub/sub); replies go to `reply.celery.pidbox`.
_PIDBOX_CHANNELS = " ".join(f"&/{db}.celery.pidbox" for db in range(16))
_PIDBOX = f"{_PIDBOX_CHANNELS} ~*.celery.pidbox*"
# Celery's task events (FRLM_CELERY_EVENTS) are the fanout exchange `celeryev`, published
# on "/<db>.celeryev/<routing key>" (task.sent, task.started, worker.heartbeat...).
_EVENTS = "+publish &/*.celeryev/*"
# The roles that send or run tasks, and so publish events when they are on.
EVENT_ROLES = ("web", "conductor", "worker")

# What any client library sends when it connects: authenticate, name itself, say which
# library it is, check the line, pick the database.
_CONNECT = "+auth +hello +ping +echo +select +quit +reset +client|setname +client|id"

# Commands of the server-side roles: all that read and write data, scripts, pub/sub and
# transactions; none that administer the server (CONFIG, ACL, SHUTDOWN, DEBUG, MONITOR,
# FLUSHALL, KEYS: the @admin and @dangerous categories). Their keys are what narrows them.
_SERVER_COMMANDS = "+@all -@admin -@dangerous"

ROLES: dict[str, str] = {
    # The stack itself, the test harness and an operator's CLI commands on the server
    # (they hold SECRET_KEY, so they could derive any role's password anyway).
    "admin": "~* &* +@all",
    # The web server: pages read presence, progress, reputation (read only), breakers
    # (read only); the worker API records strikes and keeps its replay cache and its
    # throttles in frlm:api:*, the sign-in forms theirs in frlm:login:*; launching a run
    # queues it on Celery's `runs`; cancelling writes the run's cancel flag; the live page
    # registers watchers; the channel layer lives under asgi*.
    # The worker gateway it hosts pops jobs from the workers' queues, reads the cancelled
    # sets, delivers results to the run's stream and appends the workers' events. Its
    # watcher of run leases reads a lost conductor's events still on the stream (what the
    # run spent: runs/salvage.py); its pages read every run's stored trace anyway.
    "web": " ".join(
        [
            _SERVER_COMMANDS,
            _CELERY_RUNS,
            _CELERY_WORKER_QUEUES,
            "~frlm:presence:* ~frlm:run:* ~frlm:api:* ~frlm:health:* ~frlm:live:*",
            "~frlm:login:*",  # failed sign-ins per address and username
            # Strikes (frlm:worker:<id>:strikes and :why); the gateway's hands, what its
            # pumps popped until claimed (frlm:worker:<id>:hand:*, :hands).
            "~frlm:worker:*",
            "%R~frlm:rep:* %R~frlm:circuit:*",
            "%R~frlm:recorder:alive %R~frlm:forwarder:alive",
            "~frlm:events ~frlm:seq:*",
            "~asgi*",
            _PIDBOX,
        ]
    ),
    # The conductor runs the runs: consumes `runs`, publishes jobs to the workers' queues
    # and revokes cancelled ones (pidbox), reads results, keeps reputation, strikes and
    # breakers, writes progress, presence, events; its watcher of run leases reads a lost
    # conductor's events still on the stream, as the web server's does.
    "conductor": " ".join(
        [
            _SERVER_COMMANDS,
            _CELERY_RUNS,
            _CELERY_WORKER_QUEUES,
            "~frlm:presence:* ~frlm:run:* ~frlm:rep:* ~frlm:worker:* ~frlm:circuit:*",
            "%R~frlm:recorder:alive %R~frlm:live:*",
            "~frlm:events ~frlm:seq:*",
            _PIDBOX,
        ]
    ),
    # The recorder: the event stream through its consumer group, the dead letters, its
    # lease and heartbeat; it reads whether a live forwarder beats (it keeps entries for it).
    "recorder": " ".join(
        [
            _SERVER_COMMANDS,
            "~frlm:events ~frlm:events:dead ~frlm:recorder:*",
            "%R~frlm:forwarder:alive",
        ]
    ),
    # The live forwarder: the event stream through its own group, the watched runs, its
    # heartbeat, and the channel layer it publishes to.
    "forwarder": " ".join(
        [
            _SERVER_COMMANDS,
            "~frlm:events ~frlm:forwarder:* %R~frlm:live:* ~asgi*",
        ]
    ),
    # A trusted venue's worker consuming Celery directly: named commands only.
    "worker": " ".join(
        [
            "-@all",
            _CONNECT,
            # Its Celery consumer: take jobs from the queues (BRPOP), put back the ones it
            # prefetched but did not start when it stops (LPUSH), declare its queues
            # (SADD/SMEMBERS on the bindings); pipelines and MULTI around these. FRLM's own
            # consumer (workers/consumer.py) takes several at once: RPOP in wire.POP_LUA.
            "+brpop +rpop +lpush +rpush +llen +sadd +smembers +multi +exec +discard",
            "~worker.* ~venue.* ~_kombu.binding*",
            # Its pidbox queue expires unless refreshed: kombu's binding script (EVALSHA,
            # SCRIPT EXISTS and LOAD first; TIME and ZADD on _kombu.binding_deadlines in it)
            # and PEXPIRE on the queue.
            "+evalsha +script|load +script|exists +time +zadd +pexpire ~*.celery.pidbox*",
            # It listens to remote control (a revoke) but may not send any: no PUBLISH.
            "+subscribe +psubscribe +unsubscribe +punsubscribe",
            _PIDBOX_CHANNELS,
            # Its alive line (workers/alive.py): a subscription its death ends.
            "&frlm:alive:*",
            # workers/tasks.py: is the job cancelled (SISMEMBER, read only), deliver the
            # result (XADD, write only: it cannot read other workers' results).
            "+sismember %R~frlm:run:*:cancelled",
            "+xadd %W~frlm:run:*:results",
            # traces/emitter.py's append script: INCR the run's seq, XADD to frlm:events,
            # write only (the stream holds every run's prompts and replies).
            "+eval +incr %W~frlm:events ~frlm:seq:*",
            # An in-process worker's registration and heartbeats (workers/services.py)
            # write its venue's presence (an EVAL that looks for a bar first, with EXISTS).
            "+zrem +zscore +zrangebyscore +hset +hdel +hget +hmget +exists",
            "~frlm:presence:venue:*",
            # Deregistering, it bars its entry for a while (SET with PX, presence.withdraw)
            # so a late beat cannot bring it back: SET on the bar keys alone, a selector.
            # Without it the whole withdrawal failed and the entry stood until it lapsed,
            # routable (tests/workers/test_worker_stop.py).
            "(+set ~frlm:presence:venue:*:barred:*)",
        ]
    ),
    # The simulated model server needs no Redis.
    "simserver": "-@all",
}


def password(secret_key: str, role: str) -> str:
    return hmac.new(secret_key.encode(), f"frlm-redis:{role}".encode(), hashlib.sha256).hexdigest()


def has_credentials(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.username or parts.password)


def role_url(url: str, role: str, secret_key: str) -> str:
    """`url` with the credentials of `role`; unchanged when it already names a user (an
    external Redis with its own auth) or is not a redis:// URL."""
    parts = urlsplit(url)
    if has_credentials(url) or parts.scheme not in ("redis", "rediss"):
        return url
    if role not in ROLES:
        raise ValueError(f"unknown Redis role {role!r}: one of {', '.join(ROLES)}")
    netloc = f"{quote(role)}:{password(secret_key, role)}@{parts.netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def acl_lines(secret_key: str, *, events: bool = False) -> list[str]:
    """The ACL file: the default user off, every role with its password's sha256; with
    `events` (FRLM_CELERY_EVENTS), the roles that send or run tasks may publish them.

    The default user is off (no one can sign in as it, and a connection that has not
    authenticated can run nothing) but keeps every permission: Redis replays its AOF as
    the default user and re-checks the permissions of each MULTI/EXEC it replays, so a
    default user without them drops every transaction and every multi-command script
    (the emitter's) from the AOF at restart (redis/redis#14541, fixed after 7.2)."""
    lines = ["user default off resetkeys resetchannels ~* &* +@all"]
    for role, rules in ROLES.items():
        digest = hashlib.sha256(password(secret_key, role).encode()).hexdigest()
        extra = f" {_EVENTS}" if events and role in EVENT_ROLES else ""
        lines.append(f"user {role} on #{digest} resetkeys resetchannels {rules}{extra}")
    return lines


def write_acl_file(path: Path, secret_key: str, *, events: bool = False) -> Path:
    """Write the ACL file redis-server loads at start (--aclfile), readable by us only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(acl_lines(secret_key, events=events)) + "\n")
    path.chmod(0o600)
    return path
