"""A live run's progress and cancellation flag, in Redis, for the CLI and pages."""

from __future__ import annotations

from typing import Any

import redis

from frlm_web.money import money_str

TTL_S = 86_400


def progress_key(run_id: str) -> str:
    return f"frlm:run:{run_id}:progress"


def cancel_key(run_id: str) -> str:
    return f"frlm:run:{run_id}:cancel"


def write_progress(client: redis.Redis, run_id: str, *, phase: str, totals: Any) -> None:
    pipe = client.pipeline()
    pipe.hset(
        progress_key(run_id),
        mapping={
            "phase": phase,
            "turns": totals.turns,
            "subqueries": totals.subqueries,
            "settled": totals.settled,
            "failed": totals.subqueries_failed,
            "cut": totals.subqueries_cut,
            "cancelled": totals.subqueries_cancelled,
            "tokens": totals.tokens_in + totals.tokens_out,
            "cost": money_str(totals.cost),
        },
    )
    pipe.expire(progress_key(run_id), TTL_S)
    pipe.execute()


def read_progress(client: redis.Redis, run_id: str) -> dict[str, str]:
    raw = client.hgetall(progress_key(run_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


def request_cancel(client: redis.Redis, run_id: str) -> None:
    client.set(cancel_key(run_id), "1", ex=TTL_S)


def cancel_requested(client: redis.Redis, run_id: str) -> bool:
    return bool(client.exists(cancel_key(run_id)))
