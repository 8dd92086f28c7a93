"""The diff's result as plain JSON shapes, so the command and a web page show the same
thing, and the error for two runs that cannot be compared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypedDict

Kind = Literal["code", "reply", "fragments", "quorum", "structure", "routing"]
TextOf = Callable[[str], str | None]


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
