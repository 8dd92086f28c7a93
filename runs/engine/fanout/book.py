"""A full replay's decision book: what the recorded run decided and what its workers did,
read once from its trace when the replay starts. Replayed replies come back in milliseconds,
so a fanout deciding again on its timers and counts would hedge nothing, retry nothing and
cut off other sub-queries at its quorum; following the book, the replay hedges, retries,
times out and cuts off the same attempts, and its trace diffs clean against the recording's.

What the book says per attempt (depth, batch, sub-query, attempt):
- how its worker ended it (`fate`): with a reply, an error, cancelled as it started, or
  never (Celery dropped the revoked job): the replay's job carries the reply or the error,
  is revoked before it leaves, or is not published at all;
- where it went and why (`route`: the venue, and the router's `how`);
- whether it was sent as a hedge (`hedged`), timed out (`timed_out`), or cancelled while
  it was out (`held`: a hedge's loser, or found out by its batch's cut);
and per sub-query, whether the batch cut it off (`cut`: a quorum or a batch deadline), after
how many attempts, and whether it was out or still waiting to be sent."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traces import blobs, store
from traces.cassette import cassette_keep, recordings_of

# A sub-query attempt's stable place in a run: (depth, batch, sub-query index, attempt).
Place = tuple[int, int, int, int]
# A sub-query's: (depth, batch, sub-query index).
SubPlace = tuple[int, int, int]

SENT_PREFIX = "cancelled: "
UNSENT_PREFIX = "cancelled before it was sent: "
# A run cancelled by its user is not a decision the replay can follow: it runs on.
RUN_CANCELLED = "the run was cancelled"
# How a hedge's loser's SubQuery.Cancel begins (hedging.Hedger.drop_twin).
HEDGE_LOSS = "hedged: "


def attempt_place(depth: int, batch: int, index: int, sq_id: str, attempts: int) -> Place:
    """An attempt's Place: its own number from its id ("12.2"), else `attempts` (a hedge
    and its twin share their outcome's count)."""
    number = _attempt(sq_id)
    return (depth, batch, index, attempts if number is None else number)


@dataclass(frozen=True)
class Fate:
    """How a recorded attempt's worker ended its Execute span."""

    status: str  # ok | error | cancelled | abandoned, or running (no end stored yet)
    error: str = ""
    reply: dict[str, Any] | None = None  # an ok one's: text, tokens, cost, ms, request_hash


@dataclass(frozen=True)
class Cut:
    """A sub-query the batch cut off (cancel_rest): after how many attempts, whether the
    last was out (else it waited to be sent), and the reason the batch gave."""

    attempts: int
    sent: bool
    reason: str


@dataclass
class Book:
    hedges: frozenset[Place]  # the hedge attempts the recording sent
    # Attempts the recording cancelled while they were out: a hedge's loser (its twin
    # answered first), or one its batch's cut found out (quorum, deadline).
    losers: frozenset[Place]
    cut_out: frozenset[Place]
    # The recorded reply per sub-query: the first that came back.
    replies: dict[SubPlace, dict[str, Any]] = field(default_factory=dict)
    fates: dict[Place, Fate] = field(default_factory=dict)
    timeouts: frozenset[Place] = frozenset()
    cuts: dict[SubPlace, Cut] = field(default_factory=dict)
    # Where each attempt went and why: (venue, the router's `how`: score, explore, ...).
    routes: dict[Place, tuple[str, str]] = field(default_factory=dict)
    # Every attempt the recording sent: a first one that left, each retry and hedge.
    made: frozenset[Place] = frozenset()

    def hedged(self, depth: int, batch: int, sq: int, attempt: int) -> bool:
        """Whether the recording sent `attempt` of this sub-query as a hedge."""
        return (depth, batch, sq, attempt) in self.hedges

    def ran(self, place: Place) -> bool:
        """Whether a worker of the recording started this attempt: a hedge's loser that ran
        runs to its end in the replay too, one that never started is revoked."""
        return place in self.fates

    # --- attempts -------------------------------------------------------------------
    def recorded(self, place: Place) -> dict[str, Any] | None:
        """What the attempt's job carries for its worker (Job.recorded): the recorded
        reply, or the error its worker failed with; None when the recording has neither."""
        fate = self.fates.get(place)
        if fate is not None and fate.status == "error":
            return {"error": fate.error}
        if fate is not None and fate.reply is not None:
            return fate.reply
        return self.replies.get(place[:3])

    def withheld(self, place: Place) -> bool:
        """Whether no worker ever started this attempt (its job was revoked while queued):
        the replay's is not published either. Only for an attempt the recording sent and
        gave up while it was out (cut off, timed out, or another attempt answered): any
        other the replay needs answered. One the recording never made is the replay's own
        (a retry after the replay lost a worker where the recording lost none): it goes,
        and its job carries the recorded reply. Withheld, it waited out the sub-query's
        timeout (bench/replay.py: 39 of them, 61 s)."""
        if place in self.fates or place not in self.made:
            return False
        given_up = place in self.cut_out or place in self.losers or place in self.timeouts
        return given_up or place[:3] in self.replies

    def cancelled_at(self, place: Place) -> bool:
        """Whether the attempt's worker found it cancelled as it started: the replay's is
        revoked before it leaves, so its worker does the same."""
        fate = self.fates.get(place)
        return fate is not None and fate.status == "cancelled"

    def route(self, place: Place) -> tuple[str, str] | None:
        """The venue the recording sent this attempt to, and why (Target.how)."""
        return self.routes.get(place)

    def timed_out(self, place: Place) -> bool:
        return place in self.timeouts

    # --- the batch ------------------------------------------------------------------
    def cut(self, sub: SubPlace) -> Cut | None:
        return self.cuts.get(sub)

    def held(self, place: Place) -> bool:
        """Whether this attempt's reply, if any, goes unheard: the recording cancelled it
        while it was out, so its twin's reply or the batch's cut settles it."""
        return place in self.cut_out or place in self.losers

    def found_out(self, sub: SubPlace) -> list[Place]:
        """The attempts of the sub-query that the batch's cut found out."""
        return [p for p in self.cut_out if p[:3] == sub]

    def waits(self, place: Place) -> bool:
        """Whether the sub-query was still waiting to be sent, after `place`'s attempts
        (place[3] being the attempts it has made), when the batch cut it off."""
        cut = self.cuts.get(place[:3])
        return cut is not None and not cut.sent and cut.attempts == place[3]


def load_book(run_id: str) -> Book:
    """The recorded run's decisions, keyed by where they were taken (its Submit spans'
    depth, batch and index; the attempt number)."""
    events = store.read_events(run_id)
    # Replies repeat (a hedge's twins, the root's turns): each payload is read once, and
    # the same read gives the root turns their cassette (workers.backends.chat).
    text = functools.cache(blobs.blob_get)
    reader = _Reader(text)
    for event in events:
        reader.add(event)
    cassette_keep(run_id, recordings_of(events, text))
    return reader.book()


def _attempt(sq_id: Any) -> int | None:
    """The attempt number of a sub-query attempt id ("12.2" -> 2)."""
    _, _, attempt = str(sq_id or "").partition(".")
    return int(attempt) if attempt.isdigit() else None


class _Reader:
    """The trace read event by event into a Book."""

    def __init__(self, text: Callable[[str], str | None]) -> None:
        self.text = text
        self.submits: dict[str, SubPlace] = {}  # Submit span -> its sub-query
        self.hedges: list[tuple[str, int]] = []
        self.executed: dict[str, tuple[str, int | None]] = {}  # Execute -> (Submit, attempt)
        self.ends: list[dict[str, Any]] = []  # Execute ends
        self.timeouts: list[tuple[str, int | None]] = []
        self.cuts: list[dict[str, Any]] = []  # Submit ends cancelled
        self.routes: list[tuple[str, int | None, str, str]] = []  # (Submit, attempt, venue, how)
        self.cancels: list[tuple[str, int | None, str]] = []  # (Submit, attempt, reason)
        self.made: list[tuple[str, int]] = []  # (Submit, attempt) of every attempt sent

    def add(self, event: dict[str, Any]) -> None:
        name, phase, attrs = event["name"], event["phase"], event["attrs"]
        if name in ("SubQuery.Retry", "SubQuery.Hedge") and event["parent_id"]:
            self._routed(event["parent_id"], attrs.get("attempt"), event)
            if isinstance(attrs.get("attempt"), int):
                self.made.append((event["parent_id"], attrs["attempt"]))
        if name == "SubQuery.Submit" and phase == "start":
            self.submits[event["span_id"]] = (
                event["depth"] or 0,
                attrs.get("batch", 0),
                attrs.get("sq", 0),
            )
            if attrs.get("route"):  # a first attempt that left (not one settled unsent)
                self._routed(event["span_id"], 1, event)
                self.made.append((event["span_id"], 1))
        elif name == "SubQuery.Submit" and phase == "end" and event["status"] == "cancelled":
            self.cuts.append(event)
        elif name == "SubQuery.Hedge" and event["parent_id"]:
            self.hedges.append((event["parent_id"], attrs["attempt"]))
        elif name == "SubQuery.Cancel" and event["parent_id"]:
            reason = str(attrs.get("reason") or "")
            self.cancels.append((event["parent_id"], _attempt(attrs.get("sq_id")), reason))
        elif name == "SubQuery.Timeout" and event["parent_id"]:
            self.timeouts.append((event["parent_id"], _attempt(attrs.get("sq_id"))))
        elif name == "SubQuery.Execute" and phase == "start" and event["parent_id"]:
            self.executed[event["span_id"]] = (event["parent_id"], _attempt(attrs.get("sq_id")))
        elif name == "SubQuery.Execute" and phase == "end":
            self.ends.append(event)

    def _routed(self, submit: str, attempt: Any, event: dict[str, Any]) -> None:
        venue = event["venue"] or event["attrs"].get("venue")
        how = event["attrs"].get("route")
        if venue and how and isinstance(attempt, int):
            self.routes.append((submit, attempt, str(venue), str(how)))

    def place(self, submit: str, attempt: int | None) -> Place | None:
        sub = self.submits.get(submit)
        return None if sub is None or attempt is None else (*sub, attempt)

    def book(self) -> Book:
        fates, replies = self._fates()
        cancelled = [(p, reason) for s, a, reason in self.cancels if (p := self.place(s, a))]
        return Book(
            frozenset(p for s, a in self.hedges if (p := self.place(s, a))),
            frozenset(p for p, reason in cancelled if reason.startswith(HEDGE_LOSS)),
            frozenset(
                p
                for p, reason in cancelled
                if not reason.startswith(HEDGE_LOSS) and reason != RUN_CANCELLED
            ),
            replies,
            fates,
            frozenset(p for s, a in self.timeouts if (p := self.place(s, a))),
            self._cuts(),
            {p: (venue, how) for s, a, venue, how in self.routes if (p := self.place(s, a))},
            frozenset(p for s, a in self.made if (p := self.place(s, a))),
        )

    def _fates(self) -> tuple[dict[Place, Fate], dict[SubPlace, dict[str, Any]]]:
        # A worker that started and has not ended (yet: a straggler's end may come after
        # the run's) ran all the same.
        fates: dict[Place, Fate] = {
            place: Fate("running")
            for submit, attempt in self.executed.values()
            if (place := self.place(submit, attempt)) is not None
        }
        replies: dict[SubPlace, dict[str, Any]] = {}
        for event in self.ends:
            place = self.place(*self.executed.get(event["span_id"], ("", None)))
            if place is None:
                continue
            status = event["status"]
            # An ok one whose reply is not stored has none: the cassette is asked instead.
            reply = _reply(event, self.text) if status == "ok" else None
            fates[place] = Fate(status, str(event["attrs"].get("error") or ""), reply)
            if reply is not None:
                replies.setdefault(place[:3], reply)
        return fates, replies

    def _cuts(self) -> dict[SubPlace, Cut]:
        cuts: dict[SubPlace, Cut] = {}
        for event in self.cuts:
            sub = self.submits.get(event["span_id"])
            error = str(event["attrs"].get("error") or "")
            sent = not error.startswith(UNSENT_PREFIX)
            reason = error.removeprefix(UNSENT_PREFIX).removeprefix(SENT_PREFIX)
            if sub is None or reason == RUN_CANCELLED:
                continue
            cuts[sub] = Cut(int(event["attrs"].get("attempts") or 0), sent, reason)
        return cuts


def _reply(event: dict[str, Any], read: Callable[[str], str | None]) -> dict[str, Any] | None:
    """An ok Execute end's reply as a job carries it, or None when its text is not stored."""
    text = read(event["payload_ref"]) if event["payload_ref"] else None
    if text is None:
        return None
    return {
        "text": text,
        "tokens_in": event["tokens_in"] or 0,
        "tokens_out": event["tokens_out"] or 0,
        "cost": event["cost"],
        "ms": event["ms"] or 0.0,
        "request_hash": event["attrs"].get("request_hash") or "",
    }
