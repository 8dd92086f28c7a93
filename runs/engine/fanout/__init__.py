"""Asynchronous fanout: a batch of sub-queries goes out as Celery jobs on the run's venues and
is collected from the run's result stream as replies arrive, under a quorum and deadlines,
then judged and paid for. The package, one responsibility a module:

- core: the Fanout, which reads as the life of a batch (plan, send, collect, judge, settle)
  and holds the parts below;
- state: what the parts share (Flight, Batch, Wave, Scope, Roster, Outcome, Totals, errors);
- routing: who is live, dispatch credits, and where each job goes (scheduler, round robin,
  shared queues), fed by reputations and circuit breakers;
- transport: every Celery and Redis edge (publish, the result stream, revoke);
- attempts: an attempt's start and end (prepare, settle, retry, abandon, cancel);
- intake: a reply's checks (its sender, its signature) and strikes;
- liveness: deadlines, lost workers, the wait for a worker when none is live;
- hedging: latency quantiles per venue, stragglers' twins;
- book: a full replay's recorded decisions (hedges, retries, timeouts, quorum and deadline
  cut-offs, venues) and what its workers did, followed instead of timers and counts;
- spending: reserve, settle or release, and pay, against the run's accounts;
- judging: the objective, redundant and high-trust rounds, given a send callback;
- vouching: the check gate, which checks each untrusted worker's first answer of a batch
  while the batch is out and holds its work back until the verdict.

Other modules import the public names from here."""

from __future__ import annotations

from runs.engine.fanout.core import Fanout
from runs.engine.fanout.liveness import NO_VENUE
from runs.engine.fanout.state import CALL_TIERS, FanoutAbort, LimitExceeded, Outcome, Totals

__all__ = ["CALL_TIERS", "NO_VENUE", "Fanout", "FanoutAbort", "LimitExceeded", "Outcome", "Totals"]
