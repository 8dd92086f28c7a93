"""Where a job goes: the policy's routing. By default the scheduler (workers.scheduler) sends
it to one registered worker's own queue, the one expected to finish it first given
reputation, latency, load and price; "shared" puts it on the venue's queue for any free
worker (what Celery does by itself); "round_robin" deals jobs to workers in turn.

Dispatch is credit-based: a worker (or, for a shared queue, a venue) is given as many jobs
as it has slots, plus a margin that hides the refill round trip, and each reply frees
a credit for the next job. Queues stay short, so a slow or busy worker takes less work
instead of holding the batch's tail, and every decision is made with current figures.

The router reads who is live (the Roster it keeps for the other parts), and what finished
attempts say about their workers feeds the reputations and circuit breakers it plans with."""

from __future__ import annotations

import itertools
import math
import random
import time

import redis
from django.conf import settings

from runs.engine.fanout.state import FanoutAbort, Flight, Roster, Scope, Target, Wave
from runs.trust import accounts
from traces.emitter import Emitter
from workers import scheduler, venues
from workers.circuit import Breakers, Step
from workers.reputation import Observation, Reputation, Reputations

# How often the liveness of workers holding jobs is checked, in seconds.
LIVENESS_EVERY_S = 1.0
REREAD_S = 0.1  # presence read again for an unknown sender at most this often
# Jobs queued at a venue beyond its slots, as a fraction of them: one per slot, because a
# batch's replies come in clumps (its sub-queries start together and take alike), so every
# slot needs its next job waiting while the refill is on its way. The scheduler still
# queues a job only where it would finish soonest, and an untrusted worker reserves no more
# than its prefetch of one per slot.
QUEUE_MARGIN = 1.0
# After a gateway's word that a worker dropped: presence read at every refresh this long
# (the gateway tells the runs first, then withdraws the worker).
LOOK_AGAIN_S = 0.5
# A worker's measured latency older than this says little about it now (its load, and the
# machine's, have changed since), and a worker the scheduler stopped using for a slow
# moment would never be measured again: past it the worker is planned at the fleet's
# median until its next reply. Without it, two workers that happened to be measured fast
# took 72% of an honest swarm's work on a loaded machine, seven got under half their
# share (bench/trust.py, issue 23).
LATENCY_STALE_S = 30.0
# A typical sub-query, for comparing workers' prices: tokens in and out.
TYPICAL_TOKENS = (1000, 100)


def planning_latency(rep: Reputation, reported_ms: float | None, now: float) -> float | None:
    """The latency the scheduler plans a worker with: its measured EWMA while fresh; None
    (the fleet's median, scheduler.plan's prior) once older than LATENCY_STALE_S; what the
    worker reports of itself only while it has never been measured."""
    if rep.latency_ms is None:
        return reported_ms or None
    if rep.latency_at is not None and now - rep.latency_at > LATENCY_STALE_S:
        return None
    return rep.latency_ms


class Router:
    def __init__(
        self,
        *,
        scope: Scope,
        roster: Roster,
        client: redis.Redis,
        emitter: Emitter,
        accounts: accounts.RunAccounts,
        rng: random.Random,
    ) -> None:
        self.scope = scope
        self.roster = roster
        self.client = client
        self.emitter = emitter
        self.accounts = accounts
        self.rng = rng
        self.reputations = Reputations(client, lie_penalty=scope.policy.lie_penalty)
        self.breakers = Breakers(client)
        policy = scope.policy
        self.weights = scheduler.Weights(
            latency=policy.weight_latency,
            reputation=policy.weight_reputation,
            price=policy.weight_price,
            load=policy.weight_load,
            explore=policy.explore,
            min_reputation=policy.min_reputation,
            max_price_ratio=policy.max_price_ratio,
        )
        self._checked = 0.0
        self._watch_until = 0.0  # presence read at every refresh until then (look_again)
        self._turn = 0  # round-robin position
        # Workers that refused a job of this run for the model endpoint it names: they get
        # none of its work (intake.Intake.on_result), and no strike for it.
        self.unserving: set[str] = set()

    def refresh(self, *, force: bool = False, fail_fast: bool = True) -> None:
        """Who is live on the run's venues, their reputations and their breakers: read at
        most every LIVENESS_EVERY_S, three round trips in all."""
        now = time.monotonic()
        if not force and now - self._checked < LIVENESS_EVERY_S and now >= self._watch_until:
            return
        self._checked = now
        roster, names = self.roster, self.scope.venue_names
        workers: dict[str, venues.LiveWorker] = {}
        hold = settings.FRLM_VENUE_HEARTBEAT_TTL_S
        roster.gone = {wid: at for wid, at in roster.gone.items() if now - at < hold}
        for name in names:
            entries = [
                w for w in venues.live_workers(self.client, name) if w["name"] not in roster.gone
            ]
            roster.live[name] = {w["name"] for w in entries}
            slots = sum(int(w.get("concurrency", 1)) for w in entries)
            roster.limit[name] = slots + max(2, math.ceil(slots * QUEUE_MARGIN)) if slots else 0
            workers.update({w["worker_id"]: w for w in entries if w.get("worker_id")})
        roster.workers = workers
        self.reputations.refresh(list(workers))
        scopes = [f"worker:{wid}" for wid in workers] + [f"venue:{v}" for v in names]
        self._on_transitions(self.breakers.check(scopes, time.time()))
        if force and fail_fast and not self.any_credit():
            raise FanoutAbort(
                f"no live worker on the run's venues ({', '.join(names)}); start one "
                f"with `python manage.py frlm_worker --venue {names[0]}` or `make up`"
            )

    def read_again(self) -> bool:
        """Read presence now, if it was not read in the last REREAD_S: a worker unknown to
        the roster may have joined since (it was read up to LIVENESS_EVERY_S ago). False
        when it was read that recently."""
        if time.monotonic() - self._checked < REREAD_S:
            return False
        self._checked = 0.0
        self.refresh()
        return True

    def look_again(self) -> None:
        """Read presence at each refresh for LOOK_AGAIN_S, however recent the last: a worker
        is said to have gone (the gateway saw its connection drop, and withdraws it from
        presence just after telling the runs)."""
        self._watch_until = time.monotonic() + LOOK_AGAIN_S

    def any_credit(self) -> bool:
        """Whether any venue has a live worker to take jobs. A venue whose last worker's
        alive line dropped since presence was read has none, whatever its limit says: its
        work waits for one to come back (liveness.Liveness.await_workers) instead of failing."""
        live = self.roster.live
        return any(limit and live.get(venue) for venue, limit in self.roster.limit.items())

    def plan(self, wave: Wave) -> list[tuple[Flight, Target]]:
        """The backlog jobs that should go now, and where, by the policy's routing."""
        if self.scope.policy.routing == "shared":
            return self._pick_shared(wave)
        if self.scope.policy.routing == "round_robin":
            return self._pick_round_robin(wave)
        return self._pick_scheduled(wave)

    def take(self, flight: Flight, target: Target) -> None:
        """The attempt leaves on `flight.slot`'s credit."""
        inflight = self.roster.inflight
        inflight[flight.slot] = inflight.get(flight.slot, 0) + 1
        gate = self.scope.batch.vouches if self.scope.batch is not None else None
        if gate is not None and gate.open and not flight.kind and target.worker_id:
            gate.sent[target.worker_id] = gate.sent.get(target.worker_id, 0) + 1
        if target.worker_id:
            self.breakers.dispatched(f"worker:{target.worker_id}")
        self.breakers.dispatched(f"venue:{target.venue}")

    def free(self, flight: Flight) -> None:
        """The attempt is no longer out: its credit goes to the next job."""
        inflight = self.roster.inflight
        inflight[flight.slot] = max(0, inflight.get(flight.slot, 1) - 1)

    def observe(self, flight: Flight, ok: bool, *, latency_ms: float | None = None) -> None:
        """What a finished attempt says about the worker that held it, and its venue."""
        wid = flight.worker_id
        if wid:
            self.reputations.observe(Observation(wid, completion=ok, latency_ms=latency_ms))
            self.breakers.record(f"worker:{wid}", ok)
        self.breakers.record(f"venue:{flight.venue}", ok, by=wid or "")

    def flush(self) -> None:
        """Write what was observed, in batched round trips, and trace the breakers that moved."""
        self.reputations.flush()
        self._on_transitions(self.breakers.flush(time.time()))

    def unroutable(self) -> str:
        """Why no live worker can take the backlog, in words a user can act on."""
        if self.accounts.capped_providers:
            return (
                "every live worker's provider has reached its budget cap ("
                f"{', '.join(sorted(self.accounts.capped_providers))}); raise "
                "policy.provider_budgets or add workers of another provider"
            )
        if not self.roster.workers and self.scope.policy.routing != "shared":
            return (
                f"no registered worker is live on {', '.join(self.scope.venue_names)}: start "
                "one with `python manage.py frlm_worker --venue NAME` or `frlm_swarm`"
            )
        if self.unserving and set(self.roster.workers) <= self.unserving:
            spec = self.scope.worker_model
            return (
                f"no live worker of {', '.join(self.scope.venue_names)} calls the model "
                f"endpoint {spec.base_url} ({len(self.unserving)} refused it): a worker calls "
                "only the endpoints it is configured with; start one with `frlm_worker "
                f"--backend openai --base-url {spec.base_url} --model {spec.model}`, or "
                "list it in its FRLM_ENDPOINTS"
            )
        shut = sorted(s for s, st in self.breakers.state.items() if not self.breakers.allows(s))
        if shut:
            return (
                f"every eligible worker is behind an open circuit breaker ({', '.join(shut[:5])}"
                f"{' ...' if len(shut) > 5 else ''}): they failed "
                f"{self.breakers.failures} times in a row (a venue: "
                f"{self.breakers.venue_failures}, by {self.breakers.venue_workers} workers or "
                f"more); they are tried again "
                f"{self.breakers.cooldown_s:g} s after opening"
            )
        model = self.scope.worker_model.model or "the worker model"
        return (
            f"no live worker serves {model} with a context large enough for this sub-query; "
            "register one that does, or shorten the prompt"
        )

    def _capped(self, worker: venues.LiveWorker) -> bool:
        """Whether the worker's provider has reached its budget cap in this run."""
        if not self.accounts.capped_providers:
            return False
        provider = accounts.provider_of(worker, self.scope.worker_model.model or "")
        return provider in self.accounts.capped_providers

    def _allowed(self, worker: venues.LiveWorker) -> bool:
        if worker["worker_id"] in self.unserving:
            return False
        return self.breakers.allows(f"worker:{worker['worker_id']}") and self.breakers.allows(
            f"venue:{worker['venue']}"
        )

    def _pick_scheduled(self, wave: Wave) -> list[tuple[Flight, Target]]:
        """The scheduler's plan for the backlog (workers.scheduler.plan)."""
        workers = self.roster.workers
        candidates = self._candidates(wave)
        if not scheduler.free_credit(candidates):
            # No worker has a free credit: the plan would place nothing (most pumps, while
            # every credit is out), so the backlog is not read into needs for it.
            return []
        live = set(workers)
        model = self.scope.worker_model.model or ""
        needs = []
        # The plan looks no deeper than this (scheduler.plan), and a pump runs per reply.
        depth = scheduler.PLAN_ROUNDS * sum(c.credit for c in candidates)
        backlog = list(itertools.islice(wave.backlog, depth))
        for flight in backlog:
            avoid = flight.tried & live
            if flight.roll is None:
                flight.roll = self.rng.random()
            needs.append(
                scheduler.Need(
                    tokens=len(flight.prompt) // 4,
                    model=model,
                    venues=flight.venues or self.scope.answer_venues,
                    # A job every live worker has failed may try one of them again.
                    avoid=frozenset(avoid if avoid != live else ()),
                    roll=flight.roll,
                    # Copies made to be judged together share one `tried` set (Judge).
                    group=id(flight.tried) if flight.replica_of is not None else None,
                    work=not flight.kind,
                )
            )
        return [
            (
                backlog[a["index"]],
                Target(
                    venue=a["route"]["venue"],
                    worker_id=a["worker_id"],
                    queue=workers[a["worker_id"]]["queue"],
                    how=a["route"]["how"],
                    routing=dict(a["route"]),
                ),
            )
            for a in scheduler.plan(candidates, needs, self.weights, self.rng)
        ]

    def work_room(self) -> dict[str, int]:
        """How much more of the batch's work each held-back worker may be given now
        (state.Vouches): none for a worker caught lying in the run; for one the gate holds
        (Vouches.holds), its cap less what it was given, and none past the cap while the
        check of its answer is out, it is the partner of a check, or its work still
        runs. Checks and probes still go to them. The shared and round-robin routings pick
        no worker, so they hold none back."""
        gate = self.scope.batch.vouches if self.scope.batch is not None else None
        if gate is None or not gate.open:
            return {}
        room = dict.fromkeys(gate.barred, 0)
        for wid, w in self.roster.workers.items():
            if wid in room or not gate.holds(wid, bool(w.get("trusted"))):
                continue
            left = gate.cap(wid, int(w.get("concurrency", 1))) - gate.sent.get(wid, 0)
            if left > 0:
                room[wid] = left
            elif wid in gate.pending or wid in gate.checking or self.roster.inflight.get(wid, 0):
                # A check's partner waits too, though its copy may not have left yet: it
                # took 7 more answers before its copy went out (seen in CI).
                room[wid] = 0
        return room

    def _candidates(self, wave: Wave) -> list[scheduler.Candidate]:
        """Every live worker as the scheduler sees it, told which of this run's jobs already
        run there and for how long."""
        now = time.time()
        workers = self.roster.workers
        running: dict[str, list[float]] = {wid: [] for wid in workers}
        for f in wave.out.values():
            if f.assigned in running and f.started_at > f.sent_at:
                running[f.assigned].append((now - f.started_at) * 1000)
        candidates = []
        price_in, price_out = TYPICAL_TOKENS
        room = self.work_room()
        for wid, w in workers.items():
            rep = self.reputations.get(wid)
            concurrency = int(w.get("concurrency", 1))
            candidates.append(
                scheduler.Candidate(
                    worker_id=wid,
                    venue=w["venue"],
                    queue=w["queue"],
                    concurrency=concurrency,
                    credit=concurrency + max(1, math.ceil(concurrency * QUEUE_MARGIN)),
                    inflight=self.roster.inflight.get(wid, 0),
                    latency_ms=planning_latency(rep, w.get("latency_ms"), now),
                    load=float(w.get("load") or 0.0),
                    price=(
                        float(w.get("price_in") or 0) * price_in
                        + float(w.get("price_out") or 0) * price_out
                    )
                    / 1000,
                    reputation=rep.score,
                    models=list(w.get("models") or []),
                    context_tokens=int(w.get("context_tokens") or 1 << 30),
                    allowed=self._allowed(w) and not self._capped(w),
                    running_ms=running[wid],
                    work_room=room.get(wid),
                    # A worker caught lying lately answers probes, not explored work: it
                    # earns its way back on them, not on the run's answers.
                    explorable=not rep.suspect,
                    trusted=bool(w.get("trusted")),
                )
            )
        return candidates

    def _pick_round_robin(self, wave: Wave) -> list[tuple[Flight, Target]]:
        """Each job to the next worker in turn, whatever its speed: the baseline a scheduler
        is measured against."""
        workers = self.roster.workers
        order = sorted(
            w for w, info in workers.items() if self._allowed(info) and not self._capped(info)
        )
        picks = []
        for flight in wave.backlog:
            where = flight.venues or self.scope.answer_venues
            eligible = [w for w in order if workers[w]["venue"] in where]
            if not eligible:
                continue
            wid = eligible[self._turn % len(eligible)]
            self._turn += 1
            w = workers[wid]
            picks.append(
                (flight, Target(w["venue"], wid, w["queue"], "round_robin", {"turn": self._turn}))
            )
        return picks

    def _pick_shared(self, wave: Wave) -> list[tuple[Flight, Target]]:
        """Jobs onto the venues' shared queues while a venue has credit: the live venue with
        the most free credit relative to its size; venues tried before for this sub-query
        only when no other has credit."""
        limit = self.roster.limit
        picks = []
        used = dict(self.roster.inflight)
        for flight in wave.backlog:
            where = flight.venues or self.scope.answer_venues
            open_ = [
                v
                for v in self.scope.venue_names
                if v in where
                and limit.get(v, 0) > used.get(f"venue:{v}", 0)
                and self.breakers.allows(f"venue:{v}")
            ]
            fresh = [v for v in open_ if v not in flight.tried] or open_
            if not fresh:
                continue
            best = max(fresh, key=lambda v: 1 - used.get(f"venue:{v}", 0) / limit[v])
            key = f"venue:{best}"
            routing = {"inflight": used.get(key, 0), "credit": limit[best]}
            used[key] = used.get(key, 0) + 1
            picks.append((flight, Target(best, "", venues.venue_queue(best), "shared", routing)))
        return picks

    def _on_transitions(self, steps: list[Step]) -> None:
        for step in steps:
            kind, _, who = step.scope.partition(":")
            self.emitter.instant(
                "Circuit.Open" if step.transition == "open" else "Circuit.Close",
                parent=self.scope.parent,
                depth=self.scope.depth,
                status="error" if step.transition == "open" else "ok",
                scope=kind,
                venue=who if kind == "venue" else self.roster.workers.get(who, {}).get("venue"),
                worker_id=who if kind == "worker" else None,
                failures=self.breakers.threshold(step.scope) if step.transition == "open" else None,
                probes=self.breakers.probes if step.transition == "close" else None,
                cooldown_s=self.breakers.cooldown_s,
            )
