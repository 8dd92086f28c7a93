"""Compare two runs (ARCHITECTURE.md §7). Each span tree is condensed by path, as Jaeger's trace
comparison does, siblings of the two condensed trees are aligned by longest common
subsequence, and the result says which nodes ran on one side only, how every aligned node
changed (count, latency, tokens, cost, text), and where the runs' orchestration decisions
first went different ways.

Everything here is pure over `SpanNode` trees except `run_diff`, which loads them from the
store; the result is plain JSON so the command and a web page show the same thing.

The modules: `types` (the JSON shapes), `condense`, `align` (siblings), `compare` (measures
and payload texts), `divergence` (the first decision that differs), `walk` (the report over
both trees), `render` (as text); this one compares whole runs."""

from __future__ import annotations

from traces import store
from traces.blobs import blob_get
from traces.diff.align import lcs_pairs
from traces.diff.compare import clip, dump, public, unified
from traces.diff.condense import HOLDER, Texts, count_nodes, normalise, prompt_template
from traces.diff.condense import condense as condense_tree  # `condense` stays the submodule
from traces.diff.render import format_trace_diff, show_path, top_deltas
from traces.diff.types import (
    Answers,
    Divergence,
    InputChange,
    Kind,
    NodeDelta,
    Offsets,
    OnlyNode,
    Pair,
    RoutingChange,
    Side,
    Summary,
    TextChange,
    TextOf,
    TraceDiff,
    TraceDiffError,
)
from traces.diff.walk import Differ
from traces.store import SpanNode

__all__ = [
    "Answers",
    "Divergence",
    "InputChange",
    "Kind",
    "NodeDelta",
    "Offsets",
    "OnlyNode",
    "Pair",
    "RoutingChange",
    "Side",
    "Summary",
    "TextChange",
    "TextOf",
    "TraceDiff",
    "TraceDiffError",
    "format_trace_diff",
    "lcs_pairs",
    "normalise",
    "prompt_template",
    "run_diff",
    "show_path",
    "top_deltas",
    "trace_diff",
    "unified",
]


def _all_spans(roots: list[SpanNode]) -> list[SpanNode]:
    found: list[SpanNode] = []
    todo = list(roots)
    while todo:
        span = todo.pop()
        if span.name != HOLDER:
            found.append(span)
        todo.extend(span.children)
    return found


def _origin(roots: list[SpanNode]) -> int:
    starts = [r.start_ns for r in roots if r.start_ns is not None]
    if starts:
        return min(starts)
    stamps = [ev["ts"] for r in roots for ev in r.instants if isinstance(ev.get("ts"), int)]
    return min(stamps, default=0)


def _root_run(roots: list[SpanNode]) -> SpanNode | None:
    return next((r for r in roots if r.name == "Run.Init"), None)


def _answer(roots: list[SpanNode]) -> str | None:
    for root in roots:
        for ev in root.instants:
            if ev.get("name") == "Run.Done":
                attrs = ev.get("attrs") or {}
                return str(attrs.get("answer") or attrs.get("error") or "")
    return None


def _inputs(roots_a: list[SpanNode], roots_b: list[SpanNode]) -> list[InputChange]:
    """What the runs were given (Run.Init's attributes), where it differs."""
    run_a, run_b = _root_run(roots_a), _root_run(roots_b)
    attrs_a = public(run_a.attrs) if run_a else {}
    attrs_b = public(run_b.attrs) if run_b else {}
    changes: list[InputChange] = []
    for name in sorted(attrs_a.keys() | attrs_b.keys()):
        if _input_value(name, attrs_a.get(name)) != _input_value(name, attrs_b.get(name)):
            a = dump(attrs_a[name]) if name in attrs_a else None
            b = dump(attrs_b[name]) if name in attrs_b else None
            changes.append({"field": name, "a": clip(a), "b": clip(b)})
    return changes


def _input_value(name: str, value: object) -> object:
    """An input as compared: the venues as a set (their order chose nothing)."""
    if name == "venues" and isinstance(value, list):
        return sorted(map(str, value))
    return value


def trace_diff(
    roots_a: list[SpanNode],
    roots_b: list[SpanNode],
    *,
    text: TextOf = blob_get,
    run_a: str | None = None,
    run_b: str | None = None,
) -> TraceDiff:
    """Compare two span forests (as `store.span_tree` returns them). `text` resolves a
    payload ref to its text; run_a / run_b only label the result and its errors."""
    spans_a, spans_b = _all_spans(roots_a), _all_spans(roots_b)
    for spans, label in ((spans_a, run_a or "A"), (spans_b, run_b or "B")):
        if not spans:
            raise TraceDiffError(
                f"run {label!r} has no spans to compare (its trace holds only instant events)"
            )
    texts = Texts(text)
    tree_a, tree_b = condense_tree(roots_a, texts), condense_tree(roots_b, texts)
    differ = Differ(texts, _origin(roots_a), _origin(roots_b))
    differ.walk(tree_a, tree_b, [])
    return {
        "run_a": run_a,
        "run_b": run_b,
        "summary": {
            "spans_a": len(spans_a),
            "spans_b": len(spans_b),
            "open_a": sum(1 for s in spans_a if s.open),
            "open_b": sum(1 for s in spans_b if s.open),
            "nodes_a": count_nodes(tree_a),
            "nodes_b": count_nodes(tree_b),
            "aligned": len(differ.nodes),
            "changed": sum(1 for n in differ.nodes if n["changed"]),
            "only_in_a": len(differ.only_a),
            "only_in_b": len(differ.only_b),
            "routing": len(differ.routing),
        },
        "inputs": _inputs(roots_a, roots_b),
        "answer": {"a": _answer(roots_a), "b": _answer(roots_b)},
        "first_divergence": differ.first or differ.first_routing,
        "only_in_a": differ.only_a,
        "only_in_b": differ.only_b,
        "nodes": differ.nodes,
        "routing": differ.routing,
    }


def run_diff(run_a: str, run_b: str) -> TraceDiff:
    """Compare two stored runs. Raises TraceDiffError (a ValueError, as a malformed run id
    does) naming the run that has no stored trace or no spans."""
    trees: list[list[SpanNode]] = []
    for run_id in (run_a, run_b):
        roots = store.span_tree(run_id)
        if not roots:
            raise TraceDiffError(f"no trace events stored for run {run_id!r}")
        trees.append(roots)
    return trace_diff(trees[0], trees[1], run_a=run_a, run_b=run_b)
