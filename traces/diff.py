"""Compare two runs (DESIGN §6). Each span tree is condensed by path, as Jaeger's trace
comparison does, siblings of the two condensed trees are aligned by longest common
subsequence, and the result says which nodes ran on one side only, how every aligned node
changed (count, latency, tokens, cost, text), and where the runs' orchestration decisions
first went different ways.

Everything here is pure over `SpanNode` trees except `run_diff`, which loads them from the
store; the result is plain JSON so the command and a web page show the same thing."""

from __future__ import annotations

import difflib
import json
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import islice
from typing import Any, Literal, TypedDict

from traces import store
from traces.blobs import blob_get
from traces.store import SpanNode

TEMPLATE_CHARS = 80  # how much of a normalised prompt tells a batch's template apart
TEXT_CHARS = 2000  # how much of a text a diff shows and compares line by line
DIFF_LINES = 40
HOLDER = "(run)"  # store.roots_instants' synthetic span for instants without a parent

# Instants that record how a batch treated its slow or surplus sub-queries.
STRAGGLER_EVENTS = ("SubQuery.Cancel", "SubQuery.Timeout", "SubQuery.Hedge")

Kind = Literal["code", "reply", "fragments", "quorum", "structure", "routing"]
TextOf = Callable[[str], str | None]


# --- the JSON shapes ----------------------------------------------------------------------
class Pair(TypedDict):
    """A measure on both sides; delta is B minus A."""

    a: float
    b: float
    delta: float


class Offsets(TypedDict):
    """Milliseconds from each run's start; None where the node is absent."""

    a: float | None
    b: float | None


class TextChange(TypedDict):
    """How a node's texts differ. A condensed node holds many texts: `differing` counts
    those without an equal on the other side, `a` and `b` show the first such pair."""

    differing: int
    a: str | None
    b: str | None
    diff: list[str]


class NodeDelta(TypedDict):
    path: list[str]
    name: str
    changed: bool  # anything but latency differs (latency always does between two runs)
    offset_ms: Offsets
    count: Pair
    open: Pair
    ms_total: Pair
    ms_mean: Pair
    tokens_in: Pair
    tokens_out: Pair
    cost: Pair
    statuses: dict[str, Pair]
    instants: dict[str, Pair]  # only the instant names whose counts differ
    input: TextChange | None  # prompt or code
    output: TextChange | None  # reply or cell output


class OnlyNode(TypedDict):
    """A condensed node on one side only; its descendants are not listed separately."""

    path: list[str]
    name: str
    count: int
    spans: int  # spans in its whole subtree
    offset_ms: float | None
    ms_total: float
    tokens_in: int
    tokens_out: int
    cost: float


class RoutingChange(TypedDict):
    path: list[str]
    offset_ms: Offsets
    venues_a: dict[str, int]
    venues_b: dict[str, int]
    routes_a: dict[str, int]  # routing reasons, digits normalised (they carry live load)
    routes_b: dict[str, int]


class Side(TypedDict):
    present: bool
    offset_ms: float | None
    value: str | None


class Divergence(TypedDict):
    kind: Kind
    path: list[str]
    what: str
    a: Side
    b: Side
    diff: list[str]


class InputChange(TypedDict):
    field: str
    a: str | None
    b: str | None


class Answers(TypedDict):
    a: str | None
    b: str | None


class Summary(TypedDict):
    spans_a: int
    spans_b: int
    open_a: int
    open_b: int
    nodes_a: int  # condensed
    nodes_b: int
    aligned: int
    changed: int
    only_in_a: int
    only_in_b: int
    routing: int


class TraceDiff(TypedDict):
    run_a: str | None
    run_b: str | None
    summary: Summary
    inputs: list[InputChange]  # what the runs were given (question, policy, models)
    answer: Answers
    first_divergence: Divergence | None
    only_in_a: list[OnlyNode]
    only_in_b: list[OnlyNode]
    nodes: list[NodeDelta]  # every aligned node, parents before children, in time order
    routing: list[RoutingChange]


class TraceDiffError(ValueError):
    """Two runs that cannot be compared; the message names the run and why."""


# --- condensing ---------------------------------------------------------------------------
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


class _Texts:
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


def node_key(span: SpanNode, texts: _Texts) -> str:
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
class _Stats:
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
        return (*counts, self.statuses.get("cancelled", 0), self.statuses.get("timeout", 0))


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _span_ms(span: SpanNode) -> float | None:
    if span.ms is not None:
        return float(span.ms)
    if span.start_ns is not None and span.end_ns is not None:
        return (span.end_ns - span.start_ns) / 1e6
    return None


@dataclass(eq=False)
class _Node:
    """Sibling spans with one key, condensed: what they did in sum, and their children
    condensed the same way."""

    key: str
    name: str
    spans: list[SpanNode] = field(default_factory=list)
    children: list[_Node] = field(default_factory=list)

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
    def stats(self) -> _Stats:
        s = _Stats(count=len(self.spans))
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
    def _count_instant(s: _Stats, ev: dict[str, Any]) -> None:
        name = str(ev.get("name"))
        _bump(s.instants, name)
        if name not in STRAGGLER_EVENTS:
            return
        ts = ev.get("ts")
        if isinstance(ts, int) and (s.first_straggler_ns is None or ts < s.first_straggler_ns):
            s.first_straggler_ns = ts
        if name == "SubQuery.Cancel":
            _bump(s.cancel_reasons, str((ev.get("attrs") or {}).get("reason") or "-"))


def condense(spans: list[SpanNode], texts: _Texts) -> list[_Node]:
    """Merge siblings by key, order the merged nodes by their first start, and condense
    the pooled children of each the same way."""
    groups: dict[str, _Node] = {}
    for span in spans:
        key = node_key(span, texts)
        node = groups.get(key)
        if node is None:
            node = groups[key] = _Node(key, span.name)
        node.spans.append(span)
    nodes = sorted(groups.values(), key=_time_order)
    for node in nodes:
        node.children = condense([c for s in node.spans for c in s.children], texts)
    return nodes


def _time_order(node: _Node) -> float:
    return float("inf") if node.first_ns is None else node.first_ns


def _count_nodes(nodes: list[_Node]) -> int:
    return sum(1 + _count_nodes(n.children) for n in nodes)


# --- aligning -----------------------------------------------------------------------------
def lcs_pairs(a_keys: list[str], b_keys: list[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of two key lists. Condensed siblings
    have unique keys, so the LCS is the longest increasing run of B positions taken in A's
    order: patience sorting finds it in n log n, where the usual table costs n * m (a batch
    of distinct prompts gives thousands of siblings)."""
    where = {key: j for j, key in enumerate(b_keys)}
    seq = [(i, where[key]) for i, key in enumerate(a_keys) if key in where]
    tails: list[int] = []  # tails[k]: the least B position ending a run of length k + 1
    ends: list[int] = []  # ends[k]: index in seq of that run's last element
    before = [-1] * len(seq)
    for idx, (_, j) in enumerate(seq):
        k = bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            ends.append(idx)
        else:
            tails[k] = j
            ends[k] = idx
        before[idx] = ends[k - 1] if k else -1
    out: list[tuple[int, int]] = []
    idx = ends[-1] if ends else -1
    while idx >= 0:
        out.append(seq[idx])
        idx = before[idx]
    return out[::-1]


_Pairing = tuple[_Node | None, _Node | None]


# --- comparing ----------------------------------------------------------------------------
def _pair(a: float, b: float, digits: int = 3) -> Pair:
    return {"a": round(a, digits), "b": round(b, digits), "delta": round(b - a, digits)}


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_CHARS:
        return text
    return text[:TEXT_CHARS] + f"… [{len(text) - TEXT_CHARS} more chars]"


def unified(a: str | None, b: str | None) -> list[str]:
    """A short unified diff of two texts, hunks only."""
    if a and b and "\n" not in a and "\n" not in b and a != b:
        # Most replies of a batch are one line; difflib's set-up costs more than they do.
        return ["@@ -1 +1 @@", f"-{a[:TEXT_CHARS]}", f"+{b[:TEXT_CHARS]}"]
    lines = difflib.unified_diff(
        (a or "")[:TEXT_CHARS].splitlines(), (b or "")[:TEXT_CHARS].splitlines(), n=1, lineterm=""
    )
    return [line for line in islice(lines, DIFF_LINES + 2) if not line.startswith(("---", "+++"))]


def _dump(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _public(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if not k.startswith("_")}


class _Differ:
    """One walk over both condensed trees, parents before children and siblings in time
    order, collecting the per-node report and the first divergence met on the way."""

    def __init__(self, texts: _Texts, origin_a: int, origin_b: int) -> None:
        self.texts = texts
        self.origin_a = origin_a
        self.origin_b = origin_b
        self.nodes: list[NodeDelta] = []
        self.only_a: list[OnlyNode] = []
        self.only_b: list[OnlyNode] = []
        self.routing: list[RoutingChange] = []
        self.first: Divergence | None = None
        # Venue choice under load is not deterministic: it is the divergence only when
        # nothing else differs.
        self.first_routing: Divergence | None = None

    # --- the walk ---
    def walk(self, a: list[_Node], b: list[_Node], path: list[str]) -> None:
        pairs = self.align(a, b)
        for index, (na, nb) in enumerate(pairs):
            if na is None or nb is None:
                self.one_sided(na, nb, path)
                continue
            here = [*path, na.key]
            self.nodes.append(self.delta(na, nb, here))
            self.routes(na, nb, here)
            if self.first is None:
                self.first = self.decision(na, nb, here, pairs[index + 1 :])
            self.walk(na.children, nb.children, here)

    def align(self, a: list[_Node], b: list[_Node]) -> list[_Pairing]:
        """Matched siblings in order; between two matches, the unmatched of both sides
        interleaved by their offset from their own run's start."""
        out: list[_Pairing] = []
        i = j = 0
        for mi, mj in [*lcs_pairs([n.key for n in a], [n.key for n in b]), (len(a), len(b))]:
            loose = [(self.offset_a(n), 0, n) for n in a[i:mi]]
            loose += [(self.offset_b(n), 1, n) for n in b[j:mj]]
            loose.sort(key=lambda t: (float("inf") if t[0] is None else t[0], t[1]))
            out.extend((n, None) if side == 0 else (None, n) for _, side, n in loose)
            if mi < len(a):
                out.append((a[mi], b[mj]))
            i, j = mi + 1, mj + 1
        return out

    def offset_a(self, node: _Node | None) -> float | None:
        return self._offset(node.first_ns if node else None, self.origin_a)

    def offset_b(self, node: _Node | None) -> float | None:
        return self._offset(node.first_ns if node else None, self.origin_b)

    @staticmethod
    def _offset(ns: int | None, origin: int) -> float | None:
        return None if ns is None else round((ns - origin) / 1e6, 3)

    # --- what the report holds ---
    def one_sided(self, na: _Node | None, nb: _Node | None, path: list[str]) -> None:
        node = na or nb
        assert node is not None
        offset = self.offset_a(na) if na else self.offset_b(nb)
        s = node.stats
        only: OnlyNode = {
            "path": [*path, node.key],
            "name": node.name,
            "count": s.count,
            "spans": node.subtree_spans,
            "offset_ms": offset,
            "ms_total": round(s.ms_total, 3),
            "tokens_in": s.tokens_in,
            "tokens_out": s.tokens_out,
            "cost": round(s.cost, 8),
        }
        (self.only_a if na else self.only_b).append(only)
        if self.first is None and node.name != HOLDER:
            side = "A" if na else "B"
            self.first = self.divergence(
                "structure",
                na,
                nb,
                only["path"],
                f"{node.key} ran only in {side} ({s.count} span(s))",
                a=f"{s.count} × {node.key}" if na else None,
                b=f"{s.count} × {node.key}" if nb else None,
            )

    def delta(self, na: _Node, nb: _Node, path: list[str]) -> NodeDelta:
        sa, sb = na.stats, nb.stats
        statuses = {
            k: _pair(sa.statuses.get(k, 0), sb.statuses.get(k, 0))
            for k in sa.statuses.keys() | sb.statuses.keys()
        }
        instants = {
            k: _pair(sa.instants.get(k, 0), sb.instants.get(k, 0))
            for k in sa.instants.keys() | sb.instants.keys()
            if sa.instants.get(k) != sb.instants.get(k)
        }
        changed_in = self.payload_change(na, nb, "start_payload")
        changed_out = self.payload_change(na, nb, "end_payload")
        changed = bool(
            sa.count != sb.count
            or sa.statuses != sb.statuses
            or instants
            or sa.venues != sb.venues
            or sa.tokens_in != sb.tokens_in
            or sa.tokens_out != sb.tokens_out
            or abs(sa.cost - sb.cost) > 1e-12
            or changed_in
            or changed_out
        )
        return {
            "path": path,
            "name": na.name,
            "changed": changed,
            "offset_ms": {"a": self.offset_a(na), "b": self.offset_b(nb)},
            "count": _pair(sa.count, sb.count),
            "open": _pair(sa.open, sb.open),
            "ms_total": _pair(sa.ms_total, sb.ms_total),
            "ms_mean": _pair(sa.ms_mean, sb.ms_mean),
            "tokens_in": _pair(sa.tokens_in, sb.tokens_in),
            "tokens_out": _pair(sa.tokens_out, sb.tokens_out),
            "cost": _pair(sa.cost, sb.cost, digits=8),
            "statuses": statuses,
            "instants": instants,
            "input": changed_in,
            "output": changed_out,
        }

    def payload_change(self, na: _Node, nb: _Node, which: str) -> TextChange | None:
        """Whether the two nodes hold different texts (prompts, code, replies). A condensed
        node holds many: a text differs when no member on the other side has it, so a batch
        that only ran more copies of the same prompt has not changed its text (its count
        has). Equal refs are equal texts, so only refs found on one side are resolved."""
        refs_a = [getattr(s, which) for s in na.spans]
        refs_b = [getattr(s, which) for s in nb.spans]
        # A span without a payload (cancelled, still open) has no text to compare.
        set_a, set_b = set(refs_a) - {None}, set(refs_b) - {None}
        if set_a == set_b:
            return None
        left_a, left_b = set_a - set_b, set_b - set_a
        texts_a = {self.texts.get(r) for r in left_a}
        texts_b = {self.texts.get(r) for r in left_b}
        only_a, only_b = texts_a - texts_b, texts_b - texts_a
        if (only_a or only_b) and set_a & set_b:
            # A caller's lookup need not be content addressed: a shared ref may hold the text.
            shared = {self.texts.get(r) for r in set_a & set_b}
            only_a, only_b = only_a - shared, only_b - shared
        if not only_a and not only_b:
            return None
        a_members = [self.texts.get(r) for r in refs_a if r in left_a]
        b_members = [self.texts.get(r) for r in refs_b if r in left_b]
        a_differing = [t for t in a_members if t in only_a]
        b_differing = [t for t in b_members if t in only_b]
        a = a_differing[0] if a_differing else None
        b = b_differing[0] if b_differing else None
        return {
            "differing": max(len(a_differing), len(b_differing)),
            "a": _clip(a),
            "b": _clip(b),
            "diff": unified(a, b),
        }

    def routes(self, na: _Node, nb: _Node, path: list[str]) -> None:
        sa, sb = na.stats, nb.stats
        if na.name != "SubQuery.Submit":
            return
        if sa.count == sb.count:
            same = sa.venues == sb.venues and sa.routes == sb.routes
        else:  # more or fewer sub-queries: only a venue or reason new to one side is routing
            same = sa.venues.keys() == sb.venues.keys() and sa.routes.keys() == sb.routes.keys()
        if same:
            return
        self.routing.append(
            {
                "path": path,
                "offset_ms": {"a": self.offset_a(na), "b": self.offset_b(nb)},
                "venues_a": dict(sa.venues),
                "venues_b": dict(sb.venues),
                "routes_a": dict(sa.routes),
                "routes_b": dict(sb.routes),
            }
        )
        if self.first_routing is None:
            self.first_routing = self.divergence(
                "routing",
                na,
                nb,
                path,
                "sub-queries were routed differently; venue choice under load is not "
                "deterministic, and no other decision differs",
                a=_venues_text(sa),
                b=_venues_text(sb),
            )

    # --- the first divergence ---
    def decision(
        self, na: _Node, nb: _Node, path: list[str], later: list[_Pairing]
    ) -> Divergence | None:
        """The orchestration decision at this aligned node that differs, if one does, in
        the order they are taken: how many spans, then what the node decided (code, reply,
        fragment selection), then how its batch settled stragglers."""
        sa, sb = na.stats, nb.stats
        if sa.count != sb.count:
            return self.divergence(
                "structure",
                na,
                nb,
                path,
                f"{na.key} ran {sa.count} time(s) in A and {sb.count} in B",
                a=f"{sa.count} × {na.key}",
                b=f"{sb.count} × {nb.key}",
            )
        if na.name == "Repl.Exec":
            found = self.code(na, nb, path)
            if found:
                return found
        if na.name == "Run.Decode":
            found = self.reply(na, nb, path, later)
            if found:
                return found
        found = self.fragments(na, nb, path)
        if found:
            return found
        if na.name.startswith("SubQuery.") and sa.stragglers != sb.stragglers:
            return self.divergence(
                "quorum",
                na,
                nb,
                path,
                "the batch settled its stragglers differently (cancelled, timed out, hedged)",
                a=_stragglers_text(sa),
                b=_stragglers_text(sb),
                at_a=sa.first_straggler_ns,
                at_b=sb.first_straggler_ns,
            )
        return None

    def code(self, na: _Node | None, nb: _Node | None, path: list[str]) -> Divergence | None:
        node = na or nb
        assert node is not None
        if na is None or nb is None:
            present = self.texts.get(node.spans[0].start_payload)
            return self.divergence(
                "code",
                na,
                nb,
                path,
                f"{node.key} ran only in {'A' if na else 'B'}",
                a=_clip(present) if na else None,
                b=_clip(present) if nb else None,
                diff=unified(present if na else None, present if nb else None),
            )
        change = self.payload_change(na, nb, "start_payload")
        if change is None:
            return None
        return self.divergence(
            "code",
            na,
            nb,
            path,
            f"the code of {na.key} differs",
            a=change["a"],
            b=change["b"],
            diff=change["diff"],
        )

    def reply(
        self, na: _Node, nb: _Node, path: list[str], later: list[_Pairing]
    ) -> Divergence | None:
        """A root turn's reply carries that turn's code: when the code differs, the code is
        the decision to show; the reply is the divergence only when its code agrees."""
        if na.stats.open or nb.stats.open:
            return None  # a reply still being written is not a different reply
        change = self.payload_change(na, nb, "end_payload")
        if change is None:
            return None
        for la, lb in later:
            cell = la or lb
            assert cell is not None
            if cell.name == "Repl.Exec" and cell.turn == na.turn:
                found = self.code(la, lb, [*path[:-1], cell.key])
                if found:
                    return found
        return self.divergence(
            "reply",
            na,
            nb,
            path,
            f"the root model's reply in turn {na.turn} differs",
            a=change["a"],
            b=change["b"],
            diff=change["diff"],
        )

    def fragments(self, na: _Node, nb: _Node, path: list[str]) -> Divergence | None:
        """Fragment selection, as a span of its own or as instants on a node."""

        def chosen(node: _Node) -> list[str]:
            picks = [
                _dump(_public(ev.get("attrs") or {}))
                for span in node.spans
                for ev in span.instants
                if ev.get("name") == "Env.SelectFragments"
            ]
            if node.name == "Env.SelectFragments":
                picks += [_dump(_public(s.attrs)) for s in node.spans]
            return picks

        picks_a, picks_b = chosen(na), chosen(nb)
        if picks_a == picks_b:
            return None
        a, b = "\n".join(picks_a), "\n".join(picks_b)
        return self.divergence(
            "fragments",
            na,
            nb,
            path,
            "a different selection of context fragments",
            a=_clip(a),
            b=_clip(b),
            diff=unified(a, b),
        )

    def divergence(
        self,
        kind: Kind,
        na: _Node | None,
        nb: _Node | None,
        path: list[str],
        what: str,
        *,
        a: str | None,
        b: str | None,
        diff: list[str] | None = None,
        at_a: int | None = None,
        at_b: int | None = None,
    ) -> Divergence:
        off_a = self._offset(at_a, self.origin_a) if at_a is not None else self.offset_a(na)
        off_b = self._offset(at_b, self.origin_b) if at_b is not None else self.offset_b(nb)
        return {
            "kind": kind,
            "path": path,
            "what": what,
            "a": {"present": na is not None, "offset_ms": off_a, "value": a},
            "b": {"present": nb is not None, "offset_ms": off_b, "value": b},
            "diff": diff if diff is not None else unified(a, b),
        }


def _venues_text(s: _Stats) -> str:
    venues = ", ".join(f"{v}×{n}" for v, n in sorted(s.venues.items()))
    routes = "; ".join(sorted(s.routes))
    return f"{venues} (route: {routes})"


def _stragglers_text(s: _Stats) -> str:
    names = dict(zip(STRAGGLER_EVENTS, ("cancelled", "timed out", "hedged"), strict=True))
    parts = [f"{s.instants[k]} {label}" for k, label in names.items() if s.instants.get(k)]
    unsent = s.statuses.get("cancelled", 0) - s.instants.get("SubQuery.Cancel", 0)
    if unsent > 0:
        parts.append(f"{unsent} cancelled before they were sent")
    text = f"{s.count} sub-queries: " + (", ".join(parts) or "none cancelled or timed out")
    if s.cancel_reasons:
        text += " (" + "; ".join(sorted(s.cancel_reasons)) + ")"
    return text


# --- the whole diff -----------------------------------------------------------------------
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
    attrs_a = _public(run_a.attrs) if run_a else {}
    attrs_b = _public(run_b.attrs) if run_b else {}
    changes: list[InputChange] = []
    for name in sorted(attrs_a.keys() | attrs_b.keys()):
        if attrs_a.get(name) != attrs_b.get(name):
            a = _dump(attrs_a[name]) if name in attrs_a else None
            b = _dump(attrs_b[name]) if name in attrs_b else None
            changes.append({"field": name, "a": _clip(a), "b": _clip(b)})
    return changes


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
    texts = _Texts(text)
    tree_a, tree_b = condense(roots_a, texts), condense(roots_b, texts)
    differ = _Differ(texts, _origin(roots_a), _origin(roots_b))
    differ.walk(tree_a, tree_b, [])
    return {
        "run_a": run_a,
        "run_b": run_b,
        "summary": {
            "spans_a": len(spans_a),
            "spans_b": len(spans_b),
            "open_a": sum(1 for s in spans_a if s.open),
            "open_b": sum(1 for s in spans_b if s.open),
            "nodes_a": _count_nodes(tree_a),
            "nodes_b": _count_nodes(tree_b),
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


# --- as text ------------------------------------------------------------------------------
def top_deltas(diff: TraceDiff, n: int = 10) -> list[NodeDelta]:
    """The aligned nodes that moved most: by total latency, then cost, then tokens."""

    def weight(node: NodeDelta) -> tuple[float, float, float]:
        tokens = abs(node["tokens_in"]["delta"]) + abs(node["tokens_out"]["delta"])
        return (abs(node["ms_total"]["delta"]), abs(node["cost"]["delta"]), tokens)

    return sorted(diff["nodes"], key=weight, reverse=True)[:n]


def show_path(path: list[str]) -> str:
    return " > ".join(path)


def _seconds(ms: float | None) -> str:
    return "absent" if ms is None else f"+{ms / 1000:.3f}s"


def _indented(text: str | None, prefix: str, lines: int = 12) -> list[str]:
    if text is None:
        return [f"{prefix}(absent)"]
    rows = text.splitlines() or [""]
    shown = [f"{prefix}{row}" for row in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"{prefix}… {len(rows) - lines} more lines")
    return shown


def _signed(value: float, unit: str = "") -> str:
    return f"{value:+g}{unit}"


def format_trace_diff(diff: TraceDiff, *, top: int = 10) -> str:
    """The diff for a terminal: counts, the first divergence with both sides, routing,
    the nodes on one side only, and the top per-node deltas."""
    s = diff["summary"]
    a, b = diff["run_a"] or "(unnamed)", diff["run_b"] or "(unnamed)"
    out = [
        f"A {a}: {s['spans_a']} spans, {s['nodes_a']} condensed nodes"
        + (f", {s['open_a']} open" if s["open_a"] else ""),
        f"B {b}: {s['spans_b']} spans, {s['nodes_b']} condensed nodes"
        + (f", {s['open_b']} open" if s["open_b"] else ""),
        f"only in A: {s['only_in_a']}   only in B: {s['only_in_b']}   "
        f"changed: {s['changed']} of {s['aligned']} aligned   routing differs: {s['routing']}",
    ]
    for change in diff["inputs"]:
        shown_a, shown_b = _where_they_differ(change["a"], change["b"])
        out.append(f"input {change['field']} differs: A {shown_a}  B {shown_b}")
    out.append("")
    out.extend(_format_divergence(diff["first_divergence"]))
    for title, nodes in (("only in A", diff["only_in_a"]), ("only in B", diff["only_in_b"])):
        if nodes:
            out.append("")
            out.append(f"{title}:")
            for node in nodes[:top]:
                out.append(
                    f"  {show_path(node['path'])}  ×{node['count']} "
                    f"({node['spans']} spans, {_seconds(node['offset_ms'])})"
                )
            if len(nodes) > top:
                out.append(f"  … {len(nodes) - top} more")
    moved = [n for n in top_deltas(diff, top) if n["changed"] or n["ms_total"]["delta"]]
    if moved:
        out.append("")
        out.append("top per-node deltas (B minus A):")
        out.extend(f"  {_format_delta(node)}" for node in moved)
    answer = diff["answer"]
    if answer["a"] != answer["b"]:
        out.append("")
        out.append(f"answer: A {_short(answer['a'])}  B {_short(answer['b'])}")
    return "\n".join(out)


def _where_they_differ(a: str | None, b: str | None, limit: int = 50) -> tuple[str, str]:
    """Both texts from a little before their first difference: two long questions that
    differ near the end would otherwise show the same opening."""
    if a is None or b is None:
        return _short(a, limit), _short(b, limit)
    flat_a, flat_b = " ".join(a.split()), " ".join(b.split())
    same = next(
        (i for i, (x, y) in enumerate(zip(flat_a, flat_b, strict=False)) if x != y),
        min(len(flat_a), len(flat_b)),
    )
    start = max(0, same - 15)
    lead = "…" if start else ""
    return _short(lead + flat_a[start:], limit), _short(lead + flat_b[start:], limit)


def _short(text: str | None, limit: int = 60) -> str:
    if text is None:
        return "(none)"
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def _format_divergence(div: Divergence | None) -> list[str]:
    if div is None:
        return ["no divergence: both runs took the same orchestration decisions"]
    out = [
        f"first divergence: {div['kind']} at {show_path(div['path'])}",
        f"  {div['what']}",
        f"  A ({_seconds(div['a']['offset_ms'])}):",
        *_indented(div["a"]["value"], "    "),
        f"  B ({_seconds(div['b']['offset_ms'])}):",
        *_indented(div["b"]["value"], "    "),
    ]
    if div["diff"]:
        out.append("  diff:")
        out.extend(f"    {line}" for line in div["diff"][:DIFF_LINES])
    return out


def _format_delta(node: NodeDelta) -> str:
    count = node["count"]
    parts = [show_path(node["path"])]
    parts.append(f"×{count['a']:g}→{count['b']:g}" if count["delta"] else f"×{count['a']:g}")
    parts.append(
        f"mean {node['ms_mean']['a']:.1f}→{node['ms_mean']['b']:.1f} ms "
        f"(total {_signed(node['ms_total']['delta'], ' ms')})"
    )
    if node["tokens_in"]["delta"] or node["tokens_out"]["delta"]:
        parts.append(
            f"tokens {_signed(node['tokens_in']['delta'])}/{_signed(node['tokens_out']['delta'])}"
        )
    if node["cost"]["delta"]:
        parts.append(f"cost {_signed(node['cost']['delta'])}")
    texts = [
        label for label, change in (("input", node["input"]), ("output", node["output"])) if change
    ]
    if texts:
        parts.append(" and ".join(texts) + " changed")
    if node["instants"]:
        parts.append(
            ", ".join(f"{k} {v['a']:g}→{v['b']:g}" for k, v in sorted(node["instants"].items()))
        )
    return "  ".join(parts)
