"""The diff as text for a terminal (the frlm_diff command)."""

from __future__ import annotations

from traces.diff.compare import DIFF_LINES
from traces.diff.types import Divergence, NodeDelta, TraceDiff


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
