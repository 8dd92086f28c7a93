"""The walk over two condensed trees that builds the report: a delta per aligned node, the
nodes on one side only, the batches routed differently, and the first divergence."""

from __future__ import annotations

from traces.diff.align import Clock, align
from traces.diff.compare import pair, payload_change
from traces.diff.condense import HOLDER, Node, Texts
from traces.diff.divergence import Decisions, divergence, venues_text
from traces.diff.types import Divergence, NodeDelta, OnlyNode, RoutingChange


class Differ:
    """One walk over both condensed trees, parents before children and siblings in time
    order, collecting the per-node report and the first divergence met on the way."""

    def __init__(self, texts: Texts, origin_a: int, origin_b: int) -> None:
        self.texts = texts
        self.clock = Clock(origin_a, origin_b)
        self.decisions = Decisions(texts, self.clock)
        self.nodes: list[NodeDelta] = []
        self.only_a: list[OnlyNode] = []
        self.only_b: list[OnlyNode] = []
        self.routing: list[RoutingChange] = []
        self.first: Divergence | None = None
        # Venue choice under load is not deterministic: it is the divergence only when
        # nothing else differs.
        self.first_routing: Divergence | None = None

    def walk(self, a: list[Node], b: list[Node], path: list[str]) -> None:
        pairs = align(a, b, self.clock)
        for index, (na, nb) in enumerate(pairs):
            if na is None or nb is None:
                self.one_sided(na, nb, path)
                continue
            here = [*path, na.key]
            self.nodes.append(self.delta(na, nb, here))
            self.routes(na, nb, here)
            if self.first is None:
                self.first = self.decisions.decision(na, nb, here, pairs[index + 1 :])
            self.walk(na.children, nb.children, here)

    # --- what the report holds ---
    def one_sided(self, na: Node | None, nb: Node | None, path: list[str]) -> None:
        node = na or nb
        assert node is not None
        offset = self.clock.offset_a(na) if na else self.clock.offset_b(nb)
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
            self.first = divergence(
                self.clock,
                "structure",
                na,
                nb,
                only["path"],
                f"{node.key} ran only in {side} ({s.count} span(s))",
                a=f"{s.count} × {node.key}" if na else None,
                b=f"{s.count} × {node.key}" if nb else None,
            )

    def delta(self, na: Node, nb: Node, path: list[str]) -> NodeDelta:
        sa, sb = na.stats, nb.stats
        statuses = {
            k: pair(sa.statuses.get(k, 0), sb.statuses.get(k, 0))
            for k in sa.statuses.keys() | sb.statuses.keys()
        }
        instants = {
            k: pair(sa.instants.get(k, 0), sb.instants.get(k, 0))
            for k in sa.instants.keys() | sb.instants.keys()
            if sa.instants.get(k) != sb.instants.get(k)
        }
        changed_in = payload_change(self.texts, na, nb, "start_payload")
        changed_out = payload_change(self.texts, na, nb, "end_payload")
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
            "offset_ms": {"a": self.clock.offset_a(na), "b": self.clock.offset_b(nb)},
            "count": pair(sa.count, sb.count),
            "open": pair(sa.open, sb.open),
            "ms_total": pair(sa.ms_total, sb.ms_total),
            "ms_mean": pair(sa.ms_mean, sb.ms_mean),
            "tokens_in": pair(sa.tokens_in, sb.tokens_in),
            "tokens_out": pair(sa.tokens_out, sb.tokens_out),
            "cost": pair(sa.cost, sb.cost, digits=8),
            "statuses": statuses,
            "instants": instants,
            "input": changed_in,
            "output": changed_out,
        }

    def routes(self, na: Node, nb: Node, path: list[str]) -> None:
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
                "offset_ms": {"a": self.clock.offset_a(na), "b": self.clock.offset_b(nb)},
                "venues_a": dict(sa.venues),
                "venues_b": dict(sb.venues),
                "routes_a": dict(sa.routes),
                "routes_b": dict(sb.routes),
            }
        )
        if self.first_routing is None:
            self.first_routing = divergence(
                self.clock,
                "routing",
                na,
                nb,
                path,
                "sub-queries were routed differently; venue choice under load is not "
                "deterministic, and no other decision differs",
                a=venues_text(sa),
                b=venues_text(sb),
            )
