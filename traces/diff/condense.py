"""Condensing a span tree by path, as Jaeger's trace comparison does: sibling spans with one
key (the span name, with a turn, a cell, a batch or a prompt template where those tell
spans apart) become one node that sums what they did, and their children are pooled and
condensed the same way."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from traces.diff.types import TextOf
from traces.store import SpanNode

TEMPLATE_CHARS = 80  # how much of a normalised prompt tells a batch's template apart
HOLDER = "(run)"  # store.roots_instants' synthetic span for instants without a parent

# Instants that record how a batch treated its slow or surplus sub-queries.
STRAGGLER_EVENTS = ("SubQuery.Cancel", "SubQuery.Timeout", "SubQuery.Hedge")

_HEX_RUN = re.compile(r"\b[0-9a-fA-F]{8,}\b")
_DIGIT_TO_HASH = str.maketrans("0123456789", "#" * 10)


def _hex_id(match: re.Match[str]) -> str:
    # Only a run that mixes digits and letters is an id (a hash, a uuid part): a long
    # number is left to become '#', and a long word of the letters a-f stays a word.
    run = match.group()
    return "<id>" if not run.isdigit() and any(c.isdigit() for c in run) else run


def normalise(text: str) -> str:
    """Text with its variable parts made alike: ids, numbers and spacing."""
    # str.split and str.translate run at C speed where a regex with a match every few
    # characters (a chunk of numbers, of words) does not; a prompt has many.
    flat = _HEX_RUN.sub(_hex_id, " ".join(text.split())).translate(_DIGIT_TO_HASH)
    while "##" in flat:
        flat = flat.replace("##", "#")
    return flat


def prompt_template(prompt: str) -> str:
    """What a batch of prompts built from one f-string share: their normalised head. The
    fragment text usually follows the instruction, so the head is the instruction."""
    # Normalise only a prefix: twice the kept length is usually enough for the spacing and
    # digits it collapses, and the rest of a long prompt is never looked at.
    for factor in (2, 8):
        head = prompt[: TEMPLATE_CHARS * factor]
        template = normalise(head)
        if len(template) >= TEMPLATE_CHARS or len(head) == len(prompt):
            break
    return template[:TEMPLATE_CHARS]


@lru_cache(maxsize=4096)
def _route_reason(route: str) -> str:
    """A routing reason without its live load figures; the few reasons repeat endlessly."""
    return normalise(route)


class Texts:
    """Payload text by ref, each ref resolved once (batches repeat prompts and replies)."""

    def __init__(self, text: TextOf) -> None:
        self._text = text
        self._seen: dict[str, str | None] = {}
        self._templates: dict[str | None, str] = {}

    def get(self, ref: str | None) -> str | None:
        if ref is None:
            return None
        if ref not in self._seen:
            self._seen[ref] = self._text(ref)
        return self._seen[ref]

    def template(self, ref: str | None) -> str:
        """The prompt template of a payload; '?' when its text is not stored."""
        if ref not in self._templates:
            prompt = self.get(ref)
            self._templates[ref] = "?" if prompt is None else prompt_template(prompt)
        return self._templates[ref]


def node_key(span: SpanNode, texts: Texts) -> str:
    """The condensation key: spans under one parent with the same key become one node."""
    if span.name == "Run.Decode":
        return f"Run.Decode[turn={span.attrs.get('turn')}]"
    if span.name == "Repl.Exec":
        return f"Repl.Exec[turn={span.attrs.get('turn')} cell={span.attrs.get('cell')}]"
    if span.name == "SubQuery.Submit":
        batch = span.attrs.get("batch")
        if batch is not None:
            # The fanout numbers its batches: one llm_query_batched call is one node, however
            # different its prompts (a prompt that starts with its fragment has no template).
            return f"SubQuery.Submit[batch {batch}]"
        kind = "rlm: " if span.attrs.get("kind") == "rlm" else ""
        return f"SubQuery.Submit[{kind}{texts.template(span.start_payload)}]"
    return span.name


@dataclass
class Stats:
    count: int = 0
    open: int = 0
    ms_total: float = 0.0
    timed: int = 0  # spans whose latency is known (open ones have none yet)
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    # Plain dicts of counts rather than Counters: a diff of 10,000 uncondensed spans makes
    # a hundred thousand of them, and dict creation and comparison run at C speed.
    statuses: dict[str, int] = field(default_factory=dict)
    instants: dict[str, int] = field(default_factory=dict)
    venues: dict[str, int] = field(default_factory=dict)
    routes: dict[str, int] = field(default_factory=dict)
    cancel_reasons: dict[str, int] = field(default_factory=dict)
    first_straggler_ns: int | None = None

    @property
    def ms_mean(self) -> float:
        return self.ms_total / self.timed if self.timed else 0.0

    @property
    def stragglers(self) -> tuple[int, ...]:
        """How the batch settled its slow and surplus members, as comparable numbers."""
        counts = tuple(self.instants.get(name, 0) for name in STRAGGLER_EVENTS)
        return (
            *counts,
            self.statuses.get("cancelled", 0),
            self.statuses.get("timeout", 0),
            self.statuses.get("abandoned", 0),
        )


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _span_ms(span: SpanNode) -> float | None:
    if span.ms is not None:
        return float(span.ms)
    if span.start_ns is not None and span.end_ns is not None:
        return (span.end_ns - span.start_ns) / 1e6
    return None


@dataclass(eq=False)
class Node:
    """Sibling spans with one key, condensed: what they did in sum, and their children
    condensed the same way."""

    key: str
    name: str
    spans: list[SpanNode] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)

    @cached_property
    def first_ns(self) -> int | None:
        times = [s.start_ns if s.start_ns is not None else s.end_ns for s in self.spans]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    @cached_property
    def turn(self) -> Any:
        return self.spans[0].attrs.get("turn")

    @cached_property
    def subtree_spans(self) -> int:
        return len(self.spans) + sum(child.subtree_spans for child in self.children)

    @cached_property
    def stats(self) -> Stats:
        s = Stats(count=len(self.spans))
        is_submit = self.name == "SubQuery.Submit"
        for span in self.spans:
            ms = _span_ms(span)
            if ms is not None:
                s.ms_total += ms
                s.timed += 1
            is_open = span.end_ns is None and span.start_ns is not None
            s.open += is_open
            _bump(s.statuses, "open" if is_open else span.status)
            s.tokens_in += span.tokens_in or 0
            s.tokens_out += span.tokens_out or 0
            s.cost += span.cost or 0.0
            if is_submit:
                _bump(s.venues, str(span.attrs.get("venue") or span.venue or "?"))
                _bump(s.routes, _route_reason(str(span.attrs.get("route") or "-")))
            for ev in span.instants:
                self._count_instant(s, ev)
        return s

    @staticmethod
    def _count_instant(s: Stats, ev: dict[str, Any]) -> None:
        name = str(ev.get("name"))
        _bump(s.instants, name)
        if name not in STRAGGLER_EVENTS:
            return
        ts = ev.get("ts")
        if isinstance(ts, int) and (s.first_straggler_ns is None or ts < s.first_straggler_ns):
            s.first_straggler_ns = ts
        if name == "SubQuery.Cancel":
            _bump(s.cancel_reasons, str((ev.get("attrs") or {}).get("reason") or "-"))


def condense(spans: list[SpanNode], texts: Texts) -> list[Node]:
    """Merge siblings by key, order the merged nodes by their first start, and condense
    the pooled children of each the same way."""
    groups: dict[str, Node] = {}
    for span in spans:
        key = node_key(span, texts)
        node = groups.get(key)
        if node is None:
            node = groups[key] = Node(key, span.name)
        node.spans.append(span)
    nodes = sorted(groups.values(), key=_time_order)
    for node in nodes:
        node.children = condense([c for s in node.spans for c in s.children], texts)
    return nodes


def _time_order(node: Node) -> float:
    return float("inf") if node.first_ns is None else node.first_ns


def count_nodes(nodes: list[Node]) -> int:
    return sum(1 + count_nodes(n.children) for n in nodes)
