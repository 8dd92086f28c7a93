"""The first divergence: the orchestration decision at which two runs first went different
ways (how many spans ran, the code or reply a turn produced, the context fragments chosen,
how a batch settled its stragglers), with both sides and a diff of them."""

from __future__ import annotations

from traces.diff.align import Clock, Pairing, offset_ms
from traces.diff.compare import clip, dump, payload_change, public, unified
from traces.diff.condense import STRAGGLER_EVENTS, Node, Stats, Texts
from traces.diff.types import Divergence, Kind


def divergence(
    clock: Clock,
    kind: Kind,
    na: Node | None,
    nb: Node | None,
    path: list[str],
    what: str,
    *,
    a: str | None,
    b: str | None,
    diff: list[str] | None = None,
    at_a: int | None = None,
    at_b: int | None = None,
) -> Divergence:
    off_a = offset_ms(at_a, clock.origin_a) if at_a is not None else clock.offset_a(na)
    off_b = offset_ms(at_b, clock.origin_b) if at_b is not None else clock.offset_b(nb)
    return {
        "kind": kind,
        "path": path,
        "what": what,
        "a": {"present": na is not None, "offset_ms": off_a, "value": a},
        "b": {"present": nb is not None, "offset_ms": off_b, "value": b},
        "diff": diff if diff is not None else unified(a, b),
    }


class Decisions:
    """The decisions taken at an aligned node, compared in the order they are taken."""

    def __init__(self, texts: Texts, clock: Clock) -> None:
        self.texts = texts
        self.clock = clock

    def decision(
        self, na: Node, nb: Node, path: list[str], later: list[Pairing]
    ) -> Divergence | None:
        """The orchestration decision at this aligned node that differs, if one does, in
        the order they are taken: how many spans, then what the node decided (code, reply,
        fragment selection), then how its batch settled stragglers."""
        sa, sb = na.stats, nb.stats
        if sa.count != sb.count:
            return divergence(
                self.clock,
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
            return divergence(
                self.clock,
                "quorum",
                na,
                nb,
                path,
                "the batch settled its stragglers differently "
                "(cancelled, timed out, hedged, abandoned)",
                a=_stragglers_text(sa),
                b=_stragglers_text(sb),
                at_a=sa.first_straggler_ns,
                at_b=sb.first_straggler_ns,
            )
        return None

    def code(self, na: Node | None, nb: Node | None, path: list[str]) -> Divergence | None:
        node = na or nb
        assert node is not None
        if na is None or nb is None:
            present = self.texts.get(node.spans[0].start_payload)
            return divergence(
                self.clock,
                "code",
                na,
                nb,
                path,
                f"{node.key} ran only in {'A' if na else 'B'}",
                a=clip(present) if na else None,
                b=clip(present) if nb else None,
                diff=unified(present if na else None, present if nb else None),
            )
        change = payload_change(self.texts, na, nb, "start_payload")
        if change is None:
            return None
        return divergence(
            self.clock,
            "code",
            na,
            nb,
            path,
            f"the code of {na.key} differs",
            a=change["a"],
            b=change["b"],
            diff=change["diff"],
        )

    def reply(self, na: Node, nb: Node, path: list[str], later: list[Pairing]) -> Divergence | None:
        """A root turn's reply carries that turn's code: when the code differs, the code is
        the decision to show; the reply is the divergence only when its code agrees."""
        if na.stats.open or nb.stats.open:
            return None  # a reply still being written is not a different reply
        change = payload_change(self.texts, na, nb, "end_payload")
        if change is None:
            return None
        for la, lb in later:
            cell = la or lb
            assert cell is not None
            if cell.name == "Repl.Exec" and cell.turn == na.turn:
                found = self.code(la, lb, [*path[:-1], cell.key])
                if found:
                    return found
        return divergence(
            self.clock,
            "reply",
            na,
            nb,
            path,
            f"the root model's reply in turn {na.turn} differs",
            a=change["a"],
            b=change["b"],
            diff=change["diff"],
        )

    def fragments(self, na: Node, nb: Node, path: list[str]) -> Divergence | None:
        """Fragment selection, as a span of its own or as instants on a node."""

        def chosen(node: Node) -> list[str]:
            picks = [
                dump(public(ev.get("attrs") or {}))
                for span in node.spans
                for ev in span.instants
                if ev.get("name") == "Env.SelectFragments"
            ]
            if node.name == "Env.SelectFragments":
                picks += [dump(public(s.attrs)) for s in node.spans]
            return picks

        picks_a, picks_b = chosen(na), chosen(nb)
        if picks_a == picks_b:
            return None
        a, b = "\n".join(picks_a), "\n".join(picks_b)
        return divergence(
            self.clock,
            "fragments",
            na,
            nb,
            path,
            "a different selection of context fragments",
            a=clip(a),
            b=clip(b),
            diff=unified(a, b),
        )


def venues_text(s: Stats) -> str:
    venues = ", ".join(f"{v}×{n}" for v, n in sorted(s.venues.items()))
    routes = "; ".join(sorted(s.routes))
    return f"{venues} (route: {routes})"


def _stragglers_text(s: Stats) -> str:
    names = dict(zip(STRAGGLER_EVENTS, ("cancelled", "timed out", "hedged"), strict=True))
    parts = [f"{s.instants[k]} {label}" for k, label in names.items() if s.instants.get(k)]
    unsent = s.statuses.get("cancelled", 0) - s.instants.get("SubQuery.Cancel", 0)
    if unsent > 0:
        parts.append(f"{unsent} cancelled before they were sent")
    if s.statuses.get("abandoned"):
        parts.append(f"{s.statuses['abandoned']} abandoned by a process that died")
    text = f"{s.count} sub-queries: " + (", ".join(parts) or "none cancelled or timed out")
    if s.cancel_reasons:
        text += " (" + "; ".join(sorted(s.cancel_reasons)) + ")"
    return text
