"""A full replay's decision book: the hedges the recorded run made, read once from its trace
when the replay starts. Replayed replies come back in milliseconds, so a hedger deciding
again on its timers would hedge nothing; following the book, the replay hedges the same
sub-queries at the same attempts, and its trace diffs clean against the recording's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traces import blobs, store

# A sub-query attempt's stable place in a run: (depth, batch, sub-query index, attempt).
Place = tuple[int, int, int, int]


@dataclass
class Book:
    hedges: frozenset[Place]  # the hedge attempts the recording sent
    # Per sub-query (depth, batch, index): how many of its attempts a worker started.
    started: dict[tuple[int, int, int], int]
    # Sub-queries one of whose attempts a worker started only to find it cancelled.
    cancelled_at_start: frozenset[tuple[int, int, int]]
    # The recorded reply per sub-query, put into its jobs so the replay's workers need not
    # each load the cassette (workers.backends.chat, `recorded`).
    replies: dict[tuple[int, int, int], dict[str, Any]] = field(default_factory=dict)

    def reply(self, depth: int, batch: int, sq: int) -> dict[str, Any] | None:
        return self.replies.get((depth, batch, sq))

    def hedged(self, depth: int, batch: int, sq: int, attempt: int) -> bool:
        """Whether the recording sent `attempt` of this sub-query as a hedge."""
        return (depth, batch, sq, attempt) in self.hedges

    def both_ran(self, depth: int, batch: int, sq: int) -> bool:
        """Whether the recording's hedged sub-query had both twins started by workers: then
        the loser ran to its end, else it was revoked before its worker took it."""
        return self.started.get((depth, batch, sq), 0) > 1

    def loser_cancelled(self, depth: int, batch: int, sq: int) -> bool:
        """Whether the recording's hedge loser was cancelled as its worker took it: the
        replay's loser is cancelled before it is sent, so its worker does the same."""
        return (depth, batch, sq) in self.cancelled_at_start


def load_book(run_id: str) -> Book:
    """The recorded run's decisions, keyed by where they were taken (its Submit spans'
    depth, batch and index; the hedge's attempt number)."""
    submits: dict[str, tuple[int, int, int]] = {}
    hedges: list[tuple[str, int]] = []
    executed: dict[str, str] = {}  # Execute span -> its Submit span
    cancelled: list[str] = []  # Execute spans that ended cancelled
    answered: list[dict[str, Any]] = []  # Execute ends with a reply
    for event in store.read_events(run_id):
        name = event["name"]
        if name == "SubQuery.Submit" and event["phase"] == "start":
            attrs = event["attrs"]
            submits[event["span_id"]] = (
                event["depth"] or 0,
                attrs.get("batch", 0),
                attrs.get("sq", 0),
            )
        elif name == "SubQuery.Hedge" and event["parent_id"]:
            hedges.append((event["parent_id"], event["attrs"]["attempt"]))
        elif name == "SubQuery.Execute" and event["phase"] == "start" and event["parent_id"]:
            executed[event["span_id"]] = event["parent_id"]
        elif name == "SubQuery.Execute" and event["phase"] == "end":
            if event["status"] == "cancelled":
                cancelled.append(event["span_id"])
            elif event["status"] == "ok" and event["payload_ref"]:
                answered.append(event)
    started: dict[tuple[int, int, int], int] = {}
    for parent in executed.values():
        if parent in submits:
            started[submits[parent]] = started.get(submits[parent], 0) + 1
    replies: dict[tuple[int, int, int], dict[str, Any]] = {}
    for event in answered:
        place = submits.get(executed.get(event["span_id"], ""))
        text = blobs.blob_get(event["payload_ref"])
        if place is None or place in replies or text is None:
            continue
        replies[place] = {
            "text": text,
            "tokens_in": event["tokens_in"] or 0,
            "tokens_out": event["tokens_out"] or 0,
            "cost": event["cost"],
            "ms": event["ms"] or 0.0,
            "request_hash": event["attrs"].get("request_hash") or "",
        }
    return Book(
        frozenset((*submits[parent], attempt) for parent, attempt in hedges if parent in submits),
        started,
        frozenset(
            submits[executed[span]]
            for span in cancelled
            if span in executed and executed[span] in submits
        ),
        replies,
    )
