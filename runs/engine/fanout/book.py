"""A full replay's decision book: the hedges the recorded run made, read once from its trace
when the replay starts. Replayed replies come back in milliseconds, so a hedger deciding
again on its timers would hedge nothing; following the book, the replay hedges the same
sub-queries at the same attempts, and its trace diffs clean against the recording's."""

from __future__ import annotations

from dataclasses import dataclass

from traces import store

# A sub-query attempt's stable place in a run: (depth, batch, sub-query index, attempt).
Place = tuple[int, int, int, int]


@dataclass(frozen=True)
class Book:
    hedges: frozenset[Place]  # the hedge attempts the recording sent

    def hedged(self, depth: int, batch: int, sq: int, attempt: int) -> bool:
        """Whether the recording sent `attempt` of this sub-query as a hedge."""
        return (depth, batch, sq, attempt) in self.hedges


def load_book(run_id: str) -> Book:
    """The recorded run's decisions, keyed by where they were taken (its Submit spans'
    depth, batch and index; the hedge's attempt number)."""
    submits: dict[str, tuple[int, int, int]] = {}
    hedges: list[tuple[str, int]] = []
    for event in store.read_events(run_id):
        name = event["name"]
        if name == "SubQuery.Submit" and event["phase"] == "start":
            attrs = event["attrs"]
            submits[event["span_id"]] = (event["depth"] or 0, attrs["batch"], attrs["sq"])
        elif name == "SubQuery.Hedge" and event["parent_id"]:
            hedges.append((event["parent_id"], event["attrs"]["attempt"]))
    return Book(
        frozenset((*submits[parent], attempt) for parent, attempt in hedges if parent in submits)
    )
