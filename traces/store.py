"""Typed reads of the trace store. Any process may call these while the recorder writes:
segments are immutable files that appear by rename, so a reader sees whole segments only."""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings

from frlm_web import fastjson
from traces.schema import RUN_ID

if TYPE_CHECKING:
    import duckdb


def events_dir() -> Path:
    return settings.FRLM_TRACE_DIR / "events"


def run_dir(run_id: str) -> Path:
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return events_dir() / f"run_id={run_id}"


def _segments(run_id: str) -> list[str]:
    return sorted(str(p) for p in run_dir(run_id).glob("*.parquet"))


def _columns(run_id: str, sql: str, params: list[Any] | None = None) -> dict[str, list[Any]]:
    """A query's result column by column."""
    results = _columns_many(run_id, [(sql, params)])
    return results[0] if results else {}


def _columns_many(
    run_id: str, queries: list[tuple[str, list[Any] | None]], *, arrow: bool | None = None
) -> list[dict[str, list[Any]]]:
    """Several queries over one view of the run's segments, each column by column.

    Through Arrow a result reaches Python 10-50% faster than as row tuples (a run's 2,000
    spans: 52 against 56 ms; its 6,000 events: 33 against 47 ms), but importing pyarrow
    costs 0.1-0.2 s, more than it saves on one run. So Arrow is used where the process has
    loaded it already (the recorder writes with it, the web server's run page reads with
    it), and a command such as frlm_diff, which reads two runs and exits, fetches tuples.
    `arrow` forces one way (the tests compare them)."""
    con = run_view(run_id)
    if con is None:
        return []
    if arrow is None:
        arrow = "pyarrow" in sys.modules
    out = []
    for sql, params in queries:
        relation = con.sql(sql, params=params or None)
        if arrow:
            out.append(relation.to_arrow_table().to_pydict())
            continue
        names, rows = relation.columns, relation.fetchall()
        columns = zip(*rows, strict=True) if rows else ([] for _ in names)
        out.append({name: list(column) for name, column in zip(names, columns, strict=True)})
    return out


def run_view(run_id: str) -> duckdb.DuckDBPyConnection | None:
    """This thread's connection with the run's segments as the view `ev`, or None when the
    run has none; for a query that reads the result some other way than column lists."""
    files = _segments(run_id)
    if not files:
        return None
    con = _connection()
    # The file list comes from our own glob of a checked run id, not from user text.
    view = f"SELECT * FROM read_parquet({files!r}, union_by_name=true)"  # noqa: S608
    con.execute(f"CREATE OR REPLACE TEMP VIEW ev AS {view}")
    return con


_local = threading.local()
_database: duckdb.DuckDBPyConnection | None = None
_database_lock = threading.Lock()


def _connection() -> duckdb.DuckDBPyConnection:
    """This thread's connection to the process's one in-memory DuckDB database, reused.
    It holds no database file, only views over the immutable segments (a TEMP view is
    the connection's own, so threads do not see each other's `ev`).

    Opening a database costs 25 ms; a connection to an open one (`cursor`) 10 µs. Django
    under ASGI runs each request's view on a thread of its own, so a database per thread
    was opened anew on every page and API call that read the store: the run page spent
    half its 45-55 ms there."""
    con = getattr(_local, "con", None)
    if con is None:
        global _database
        with _database_lock:
            if _database is None:
                import duckdb  # half a second: a command that never reads the store skips it

                _database = duckdb.connect()
        con = _local.con = _database.cursor()
    return con


def _query(run_id: str, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    columns = _columns(run_id, sql, params)
    if not columns:
        return []
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def stored_event_ids(run_id: str, candidates: list[str]) -> set[str]:
    if not candidates:
        return set()
    rows = _query(run_id, "SELECT event_id FROM ev WHERE list_contains(?, event_id)", [candidates])
    return {row["event_id"] for row in rows}


def read_events(run_id: str, *, after_seq: int = 0) -> list[dict[str, Any]]:
    """A run's events in seq order, from after_seq on (for live catch-up)."""
    rows = _query(
        run_id,
        "SELECT * EXCLUDE (run_id, ts), epoch_ns(ts) AS ts FROM ev WHERE seq > ? ORDER BY seq",
        [after_seq],
    )
    for row in rows:
        row["attrs"] = json.loads(row["attrs"]) if row["attrs"] else {}
    return rows


def run_ended(run_id: str) -> bool:
    """Whether the run's root span has ended (later events may still come: the attempts it
    gave up end after it)."""
    rows = _query(run_id, "SELECT count(*) AS n FROM ev WHERE phase = 'end' AND parent_id IS NULL")
    return bool(rows and rows[0]["n"])


def event_count(run_id: str) -> int:
    rows = _query(run_id, "SELECT count(*) AS n FROM ev")
    return rows[0]["n"] if rows else 0


@dataclass(slots=True)
class SpanNode:
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int | None = None
    end_ns: int | None = None
    status: str = "ok"
    venue: str | None = None
    worker_id: str | None = None
    depth: int = 0
    ms: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    start_payload: str | None = None  # blob ref of what went in (prompt, code)
    end_payload: str | None = None  # blob ref of what came out (reply, output)
    links: list[str] = field(default_factory=list)
    instants: list[dict[str, Any]] = field(default_factory=list)
    children: list[SpanNode] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.end_ns is None and self.start_ns is not None


_SPANS_SQL = """
SELECT span_id,
       any_value(parent_id) AS parent_id,
       any_value(name) AS name,
       max(epoch_ns(ts)) FILTER (WHERE phase = 'start') AS start_ns,
       max(epoch_ns(ts)) FILTER (WHERE phase = 'end') AS end_ns,
       any_value(status) FILTER (WHERE phase = 'end') AS status,
       coalesce(arg_max(venue, seq) FILTER (WHERE venue IS NOT NULL), NULL) AS venue,
       coalesce(arg_max(worker_id, seq) FILTER (WHERE worker_id IS NOT NULL), NULL) AS worker_id,
       any_value(depth) AS depth,
       any_value(ms) FILTER (WHERE phase = 'end') AS ms,
       any_value(tokens_in) FILTER (WHERE phase = 'end') AS tokens_in,
       any_value(tokens_out) FILTER (WHERE phase = 'end') AS tokens_out,
       any_value(cost) FILTER (WHERE phase = 'end') AS cost,
       any_value(payload_ref) FILTER (WHERE phase = 'start') AS start_payload,
       any_value(payload_ref) FILTER (WHERE phase = 'end') AS end_payload,
       flatten(list(links) FILTER (WHERE len(links) > 0)) AS links,
       string_agg(attrs, ',' ORDER BY seq) FILTER (WHERE attrs <> '{}') AS attrs
FROM ev WHERE phase <> 'instant' GROUP BY span_id
"""
_INSTANTS_SQL = """
SELECT span_id, parent_id, name, epoch_ns(ts) AS ts, status, venue, worker_id, depth,
       attrs, seq, payload_ref
FROM ev WHERE phase = 'instant' ORDER BY seq
"""


def span_tree(run_id: str) -> list[SpanNode]:
    """The run's spans as a forest (roots first), children in start order. Instant events
    hang on their parent span; an open span (no end yet) has end_ns None. DuckDB folds each
    span's start, progress and end events into one row; Python only links them."""
    # Tens of thousands of new objects would trigger the cycle collector again and again,
    # for nothing: none of them is garbage yet.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _span_tree(run_id)
    finally:
        if collecting:
            gc.enable()


# A finished run's span tree as DuckDB folded it, beside its segments (see _tree_columns).
TREE_CACHE = "span-tree.json"


def read_beside(run_id: str, name: str) -> tuple[list[list[Any]], bytes | None]:
    """A file kept beside the run's segments, made from them (a folded span tree, the run
    page's events): the segments' key, and the file's content when it was made from
    exactly these segments, else None. A segment is written whole, by rename, and never
    changed, so file names and sizes are the key; an event stored later adds a segment
    and makes every such file stale. The file is the key's JSON on its first line, then
    the content."""
    files = _segments(run_id)
    key = [[Path(f).name, Path(f).stat().st_size] for f in files]
    try:
        head, _, content = (run_dir(run_id) / name).read_bytes().partition(b"\n")
        if key and json.loads(head) == key:
            return key, content
    except (OSError, ValueError):
        pass  # none yet, or torn by a crash (rename makes that rare): make it again
    return key, None


def write_beside(run_id: str, name: str, key: list[list[Any]], content: bytes) -> None:
    """Keep `content` beside the run's segments, under the key read_beside gave, by
    rename (whichever reader comes first); a data directory it cannot write to is only
    read."""
    path = run_dir(run_id) / name
    tmp = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_bytes(json.dumps(key).encode() + b"\n" + content)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _tree_columns(run_id: str) -> list[dict[str, list[Any]]]:
    """The spans' and the instants' columns of the run, from the cache beside its segments
    when it is fresh (read_beside), else from DuckDB.

    A cold `frlm_diff` of two 1,000-sub-query runs spent 0.13 s importing DuckDB and 0.15 s
    per run in its queries over some 25 segments; the cache is one file that json reads in
    20 ms. It is made when every span has ended (a live run's tree changes with each
    batch): by the recorder once the run has gone quiet (Recorder.fold), or by the first
    reader to find it missing or stale."""
    key, cached = read_beside(run_id, TREE_CACHE)
    if cached is not None:
        return json.loads(cached)
    return _fold_columns(run_id, key)


def fold_tree(run_id: str) -> None:
    """Write the run's cached span tree if it is missing or stale, building nothing of the
    tree in Python: the recorder's fold of a run gone quiet (Recorder.fold). Building the
    tree as well, only to drop it, was two fifths of the fold's CPU."""
    key, cached = read_beside(run_id, TREE_CACHE)
    if cached is None:
        _fold_columns(run_id, key)


def _fold_columns(run_id: str, key: list[list[Any]]) -> list[dict[str, list[Any]]]:
    """The tree's columns from DuckDB, kept beside the segments (under `key`) once every
    span has ended."""
    columns = _columns_many(run_id, [(_SPANS_SQL, None), (_INSTANTS_SQL, None)])
    spans = columns[0] if columns else {}
    if spans and all(end is not None for end in spans["end_ns"]):
        # orjson: the standard library's encoder was a sixth of the recorder's CPU in a
        # fanout of a 1 ms model (issue 18), folding each run as it went quiet.
        write_beside(run_id, TREE_CACHE, key, fastjson.dumps(columns))
    return columns


def _span_tree(run_id: str) -> list[SpanNode]:
    results = _tree_columns(run_id)
    if not results:
        return []
    spans, instants = results
    nodes: dict[str, SpanNode] = {}
    columns = (
        "span_id",
        "parent_id",
        "name",
        "start_ns",
        "end_ns",
        "status",
        "venue",
        "worker_id",
        "depth",
        "ms",
        "tokens_in",
        "tokens_out",
        "cost",
        "start_payload",
        "end_payload",
        "links",
        "attrs",
    )
    # One parse for every span's attrs: 10,000 json.loads calls cost more than the JSON.
    parts = json.loads("[" + ",".join(f"[{a}]" if a else "[]" for a in spans["attrs"]) + "]")
    for (
        span_id,
        parent_id,
        name,
        start_ns,
        end_ns,
        status,
        venue,
        worker_id,
        depth,
        ms,
        t_in,
        t_out,
        cost,
        start_payload,
        end_payload,
        links,
        span_parts,
    ) in zip(*(spans[c] for c in columns[:-1]), parts, strict=True):
        merged: dict[str, Any] = span_parts[0] if len(span_parts) == 1 else {}
        if len(span_parts) > 1:
            for part in span_parts:
                merged.update(part)
        nodes[span_id] = SpanNode(
            span_id,
            parent_id,
            name,
            start_ns,
            end_ns,
            status or "ok",
            venue,
            worker_id,
            depth or 0,
            ms,
            t_in,
            t_out,
            cost,
            merged,
            start_payload,
            end_payload,
            list(dict.fromkeys(links)) if links else [],
        )
    roots: list[SpanNode] = []
    names = list(instants)
    # One parse for every instant's attrs too.
    attrs = json.loads("[" + ",".join(a or "{}" for a in instants["attrs"]) + "]")
    for row, ev_attrs in zip(zip(*instants.values(), strict=True), attrs, strict=True):
        ev = dict(zip(names, row, strict=True))
        ev["attrs"] = ev_attrs
        parent = nodes.get(ev["parent_id"] or "")
        (parent.instants if parent else roots_instants(roots)).append(ev)
    for node in nodes.values():
        parent = nodes.get(node.parent_id or "")
        (parent.children if parent else roots).append(node)
    for node in nodes.values():
        if len(node.children) > 1:
            node.children.sort(key=lambda n: n.start_ns or 0)
    roots.sort(key=lambda n: n.start_ns or 0)
    return roots


def roots_instants(roots: list[SpanNode]) -> list[dict[str, Any]]:
    """Instants without a parent span are kept on a synthetic holder so none is dropped."""
    for node in roots:
        if node.span_id == "":
            return node.instants
    holder = SpanNode("", None, "(run)")
    roots.append(holder)
    return holder.instants


def format_span_tree(roots: list[SpanNode], *, max_children: int = 12) -> str:
    """The tree as text: name, status, duration, where it ran, and metrics."""
    origin = min((n.start_ns for n in roots if n.start_ns), default=0)
    lines: list[str] = []

    def describe(node: SpanNode) -> str:
        offset = f"+{(node.start_ns - origin) / 1e9:8.3f}s" if node.start_ns else " " * 10
        duration = "open" if node.open else f"{node.ms:.1f} ms" if node.ms is not None else "-"
        where = (
            f" @{node.venue}" + (f"/{node.worker_id}" if node.worker_id else "")
            if node.venue
            else ""
        )
        tokens = ""
        if node.tokens_in or node.tokens_out:
            tokens = f" tok {node.tokens_in or 0}/{node.tokens_out or 0}"
        status = "" if node.status == "ok" else f" [{node.status}]"
        return f"{offset} {node.name} {duration}{status}{where}{tokens}"

    def walk(node: SpanNode, indent: str) -> None:
        lines.append(f"{indent}{describe(node)}")
        for ev in node.instants:
            lines.append(f"{indent}  · {ev['name']} [{ev['status']}] {_brief(ev['attrs'])}")
        shown = node.children
        if len(shown) > max_children:
            by_name: dict[str, int] = {}
            for child in shown:
                by_name[child.name] = by_name.get(child.name, 0) + 1
            for child in shown[: max_children // 2]:
                walk(child, indent + "  ")
            hidden = len(shown) - max_children
            lines.append(
                f"{indent}  … {hidden} more: " + ", ".join(f"{k}×{v}" for k, v in by_name.items())
            )
            for child in shown[-(max_children // 2) :]:
                walk(child, indent + "  ")
            return
        for child in shown:
            walk(child, indent + "  ")

    for root in roots:
        walk(root, "")
    return "\n".join(lines)


def _brief(attrs: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v}" for k, v in attrs.items() if not k.startswith("_"))
    return text[:120]


# --- aggregates for summaries and the movie's views -----------------------------------------


class VenueFigures(TypedDict):
    venue: str
    subqueries: int
    errors: int
    tokens_in: int
    tokens_out: int
    cost: float
    p50_ms: float | None
    p95_ms: float | None


class RunSummary(TypedDict):
    run_id: str
    events: int
    spans: int
    open_spans: int
    first_ns: int | None
    last_ns: int | None
    wall_ms: float | None
    subqueries: dict[str, int]  # by final status: ok, error, timeout, cancelled
    tokens_in: int
    tokens_out: int
    cost: float
    venues: list[VenueFigures]


def run_summary(run_id: str) -> RunSummary:
    """What a run did, from its events alone (also while it is live)."""
    totals = _query(
        run_id,
        """SELECT count(*) AS events,
                  count(DISTINCT span_id) FILTER (WHERE phase = 'start') AS spans,
                  count(DISTINCT span_id) FILTER (WHERE phase = 'end') AS ended,
                  min(epoch_ns(ts)) AS first_ns, max(epoch_ns(ts)) AS last_ns,
                  coalesce(sum(tokens_in) FILTER (WHERE phase = 'end'
                      AND name IN ('Run.Decode', 'SubQuery.Execute')), 0) AS tokens_in,
                  coalesce(sum(tokens_out) FILTER (WHERE phase = 'end'
                      AND name IN ('Run.Decode', 'SubQuery.Execute')), 0) AS tokens_out,
                  coalesce(sum(cost) FILTER (WHERE phase = 'end'
                      AND name IN ('Run.Decode', 'SubQuery.Execute')), 0) AS cost
           FROM ev""",
    )
    empty: RunSummary = {
        "run_id": run_id,
        "events": 0,
        "spans": 0,
        "open_spans": 0,
        "first_ns": None,
        "last_ns": None,
        "wall_ms": None,
        "subqueries": {},
        "tokens_in": 0,
        "tokens_out": 0,
        "cost": 0.0,
        "venues": [],
    }
    if not totals:
        return empty
    t = totals[0]
    statuses = _query(
        run_id,
        """SELECT status, count(*) AS n FROM ev
           WHERE name = 'SubQuery.Submit' AND phase = 'end' GROUP BY status""",
    )
    return {
        **empty,
        "events": t["events"],
        "spans": t["spans"],
        "open_spans": t["spans"] - t["ended"],
        "first_ns": t["first_ns"],
        "last_ns": t["last_ns"],
        "wall_ms": (t["last_ns"] - t["first_ns"]) / 1e6 if t["first_ns"] else None,
        "subqueries": {row["status"]: row["n"] for row in statuses},
        "tokens_in": int(t["tokens_in"]),
        "tokens_out": int(t["tokens_out"]),
        "cost": float(t["cost"]),
        "venues": venue_figures(run_id),
    }


def venue_figures(run_id: str) -> list[VenueFigures]:
    rows = _query(
        run_id,
        """SELECT venue, count(*) AS subqueries,
                  count(*) FILTER (WHERE status <> 'ok') AS errors,
                  coalesce(sum(tokens_in), 0) AS tokens_in,
                  coalesce(sum(tokens_out), 0) AS tokens_out,
                  coalesce(sum(cost), 0) AS cost,
                  quantile_cont(ms, 0.5) AS p50_ms, quantile_cont(ms, 0.95) AS p95_ms
           FROM ev WHERE name = 'SubQuery.Execute' AND phase = 'end'
           GROUP BY venue ORDER BY venue""",
    )
    return [VenueFigures(**row) for row in rows]  # type: ignore[typeddict-item]


class WorkerFigures(TypedDict):
    worker_id: str
    venue: str
    calls: int
    errors: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    tokens: int


def worker_figures(run_id: str) -> list[WorkerFigures]:
    """Per worker: how many sub-queries, how many failed, and their latency."""
    rows = _query(
        run_id,
        """SELECT worker_id, any_value(venue) AS venue, count(*) AS calls,
                  count(*) FILTER (WHERE status <> 'ok') AS errors, avg(ms) AS mean_ms,
                  quantile_cont(ms, 0.5) AS p50_ms, quantile_cont(ms, 0.95) AS p95_ms,
                  coalesce(sum(tokens_in), 0) + coalesce(sum(tokens_out), 0) AS tokens
           FROM ev WHERE name = 'SubQuery.Execute' AND phase = 'end' AND worker_id IS NOT NULL
           GROUP BY worker_id ORDER BY worker_id""",
    )
    return [WorkerFigures(**row) for row in rows]  # type: ignore[typeddict-item]


class Bin(TypedDict):
    bin_ms: int  # start of the bin, from the run's first event
    key: str
    events: int
    errors: int
    mean_ms: float | None
    tokens: int


def binned(run_id: str, *, bin_ms: int = 250, by: str = "name") -> list[Bin]:
    """Events per time bin and per event name or worker (the pulse and heat views)."""
    column = {"name": "name", "worker": "coalesce(worker_id, venue, 'conductor')"}.get(by)
    if column is None:
        raise ValueError("by must be 'name' or 'worker'")
    if bin_ms < 1:
        raise ValueError("bin_ms must be at least 1")
    rows = _query(
        run_id,
        # The column is one of two fixed expressions above, never user text.
        f"""WITH origin AS (SELECT min(epoch_ns(ts)) AS t0 FROM ev)
            SELECT CAST(floor((epoch_ns(ts) - t0) / 1e6 / ?) * ? AS BIGINT) AS bin_ms,
                   {column} AS key, count(*) AS events,
                   count(*) FILTER (WHERE status NOT IN ('ok')) AS errors,
                   avg(ms) AS mean_ms,
                   CAST(coalesce(sum(tokens_in), 0) + coalesce(sum(tokens_out), 0) AS BIGINT)
                       AS tokens
            FROM ev, origin GROUP BY ALL ORDER BY bin_ms, key""",  # noqa: S608
        [bin_ms, bin_ms],
    )
    return [Bin(**row) for row in rows]  # type: ignore[typeddict-item]
