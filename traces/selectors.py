"""Reads across several runs at once, for the venue and worker health pages: per-worker
activity, recent sub-queries and their history over time. Each is one DuckDB scan over the
given runs' segments instead of one per run."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, TypedDict

import duckdb

from traces import store


def _runs_query(run_ids: list[str], sql: str, params: list[Any] | None = None) -> list[dict]:
    """A query over the events of several runs at once (one scan instead of one per run)."""
    files = [str(p) for run_id in run_ids for p in sorted(store.run_dir(run_id).glob("*.parquet"))]
    if not files:
        return []
    con = store._connection()  # this thread's, to the process's one database
    for attempt in range(2):
        try:
            # The file list comes from our own globs of checked run ids, never user text.
            view = f"SELECT * FROM read_parquet({files!r}, union_by_name=true)"  # noqa: S608
            con.execute(f"CREATE OR REPLACE TEMP VIEW ev AS {view}")
            table = con.sql(sql, params=params or None).to_arrow_table()
            return table.to_pylist()
        except duckdb.IOException:
            # A segment was compacted away between the glob and the read: look again.
            if attempt:
                raise
            files = [
                str(p)
                for run_id in run_ids
                for p in sorted(store.run_dir(run_id).glob("*.parquet"))
            ]
    return []


class WorkerActivity(TypedDict):
    worker_id: str
    venue: str | None
    calls: int
    errors: int
    p50_ms: float | None
    p95_ms: float | None
    last_ms: float | None  # epoch ms of its last sub-query
    inflight: int


def worker_activity(run_ids: list[str], running: list[str]) -> dict[str, WorkerActivity]:
    """Per worker over the given runs: finished sub-queries, errors, latency; and the
    sub-queries it holds right now in the running ones."""
    rows = _runs_query(
        run_ids,
        """SELECT worker_id, any_value(venue) AS venue,
                  count(*) FILTER (WHERE phase = 'end') AS calls,
                  -- a cancelled execution (a hedge's loser, a cut) is not the worker's failure
                  count(*) FILTER (WHERE phase = 'end' AND status NOT IN ('ok', 'cancelled'))
                      AS errors,
                  quantile_cont(ms, 0.5) FILTER (WHERE phase = 'end') AS p50_ms,
                  quantile_cont(ms, 0.95) FILTER (WHERE phase = 'end') AS p95_ms,
                  max(epoch_ns(ts)) / 1e6 AS last_ms
           FROM ev WHERE name = 'SubQuery.Execute' AND worker_id IS NOT NULL
           GROUP BY worker_id""",
    )
    out: dict[str, WorkerActivity] = {r["worker_id"]: {**r, "inflight": 0} for r in rows}  # type: ignore[misc]
    open_rows = _runs_query(
        running,
        """SELECT worker_id, any_value(venue) AS venue,
                  count(DISTINCT span_id) FILTER (WHERE phase = 'start')
                  - count(DISTINCT span_id) FILTER (WHERE phase = 'end') AS inflight
           FROM ev WHERE name = 'SubQuery.Execute' AND worker_id IS NOT NULL
           GROUP BY worker_id""",
    )
    for row in open_rows:
        entry = out.setdefault(
            row["worker_id"],
            {
                "worker_id": row["worker_id"],
                "venue": row["venue"],
                "calls": 0,
                "errors": 0,
                "p50_ms": None,
                "p95_ms": None,
                "last_ms": None,
                "inflight": 0,
            },
        )
        entry["inflight"] = max(0, int(row["inflight"]))
    return out


def recent_executions(run_ids: list[str], *, per_worker: int = 20) -> dict[str, list[dict]]:
    """Each worker's latest finished sub-queries over the given runs, newest first."""
    rows = _runs_query(
        run_ids,
        # `cost` is what the worker claimed (its model call at list price); `paid` what
        # the run paid it, its receipt's (at most its own price makes of its tokens), or
        # None where no receipt was issued. A receipt names its attempt (the job's sq_id,
        # which the Execute span's start holds): a retry or a hedge on the same worker
        # under one Submit span is another attempt, another receipt (a review).
        """SELECT x.*, p.paid FROM (
               SELECT e.worker_id, e.venue, e.run_id, e.span_id, e.parent_id, e.status,
                      e.ms, e.tokens_in, e.tokens_out, e.cost, epoch_ns(e.ts) / 1e6 AS t_ms,
                      s.sq,
                      row_number() OVER (PARTITION BY e.worker_id ORDER BY e.ts DESC) AS n
               FROM ev e
               LEFT JOIN (
                   SELECT run_id, span_id, any_value(json_extract_string(attrs, '$.sq_id')) AS sq
                   FROM ev WHERE name = 'SubQuery.Execute' AND phase = 'start' GROUP BY ALL
               ) s ON s.run_id = e.run_id AND s.span_id = e.span_id
               WHERE e.name = 'SubQuery.Execute' AND e.phase = 'end'
                 AND e.worker_id IS NOT NULL) x
           LEFT JOIN (
               SELECT run_id, parent_id, worker_id,
                      json_extract_string(attrs, '$.receipt.attempt') AS attempt,
                      sum(TRY_CAST(json_extract_string(attrs, '$.receipt.paid')
                                   AS DECIMAL(38, 12))) AS paid
               FROM ev WHERE name = 'Receipt.Emit' GROUP BY ALL) p
             ON p.run_id = x.run_id AND p.parent_id = x.parent_id
            AND p.worker_id = x.worker_id AND p.attempt IS NOT DISTINCT FROM x.sq
           WHERE x.n <= ? ORDER BY x.worker_id, x.t_ms DESC""",
        [per_worker],
    )
    out: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        for internal in ("n", "parent_id", "sq"):
            row.pop(internal, None)
        out[row["worker_id"]].append(row)
    return dict(out)


def worker_history(run_ids: list[str], *, bucket_s: int) -> list[dict]:
    """Per worker and time bucket: sub-queries, errors and latency (p50, p95)."""
    return _runs_query(
        run_ids,
        """SELECT worker_id,
                  CAST(floor(epoch_ns(ts) / 1e9 / ?) * ? AS BIGINT) * 1000 AS t_ms,
                  count(*) AS calls,
                  count(*) FILTER (WHERE status NOT IN ('ok', 'cancelled')) AS errors,
                  quantile_cont(ms, 0.5) AS p50_ms, quantile_cont(ms, 0.95) AS p95_ms
           FROM ev WHERE name = 'SubQuery.Execute' AND phase = 'end'
             AND worker_id IS NOT NULL
           GROUP BY ALL ORDER BY worker_id, t_ms""",
        [bucket_s, bucket_s],
    )


def runs_events(run_ids: list[str], names: list[str]) -> list[dict[str, Any]]:
    """The events of the given names over several runs, in time order, with their attrs
    parsed: what an experiment's report measures across a whole suite in one scan."""
    rows = _runs_query(
        run_ids,
        """SELECT run_id, name, phase, span_id, parent_id, epoch_ns(ts) AS ts, ms, status,
                  venue, worker_id, cost, tokens_in, tokens_out, attrs
           FROM ev WHERE list_contains(?, name) ORDER BY ts, seq""",
        [names],
    )
    for row in rows:
        row["attrs"] = json.loads(row["attrs"]) if row["attrs"] else {}
    return rows


WORKERS_CACHE = "worker-ids.json"


def run_worker_ids(run_id: str) -> list[str]:
    """The workers that appear in one run's trace, for naming them on its page: kept beside
    its segments (store.read_beside) for the next page load, which then reads a small file
    instead of querying every segment (a third of the run page's 24 ms)."""
    key, cached = store.read_beside(run_id, WORKERS_CACHE)
    if cached is not None:
        return json.loads(cached)
    rows = store._query(
        run_id, "SELECT DISTINCT worker_id FROM ev WHERE worker_id IS NOT NULL ORDER BY 1"
    )
    ids = [row["worker_id"] for row in rows]
    if key:
        store.write_beside(run_id, WORKERS_CACHE, key, json.dumps(ids).encode())
    return ids
