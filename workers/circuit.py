"""Circuit breakers per worker and per venue: after FAILURES consecutive failures a circuit
opens and nothing is sent there; after COOLDOWN_S it is half-open and PROBES sub-queries
are let through (offered again a cooldown later if they never come back: cancelled, or
their conductor died); if they all succeed it closes, if one fails it opens again (a venue's:
if probes of VENUE_WORKERS distinct workers fail; one worker's failed probe is given back
for another worker to try, so a worker cannot hold its venue shut by failing its probes).

A venue's breaker is for a venue that is down (its endpoint, its network), not for one of
its workers: that worker has its own breaker. So it opens after VENUE_FAILURES consecutive
failures (twice a worker's by default: a venue of many workers that each fail now and then
would otherwise close itself by chance) and only when they came from at least
VENUE_WORKERS distinct workers, so one hostile or broken worker failing the sixteen jobs it
holds at once cannot shut the venue for everyone. A failure nobody started (a job that
timed out in the venue's queue) counts as a distinct worker of its own.

State lives in Redis so that every conductor sees the same breaker, and transitions are
made by a Lua script, so exactly one caller sees each transition and emits its event."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from django.conf import settings

from frlm_web.redis_client import LuaScript

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

# KEYS[1]: the breaker, KEYS[2]: the workers whose failures are in its current run.
# ARGV: now, failures to open, cooldown seconds, probes, distinct workers to open, then the
# events (check|probe|success|failure, a failure as "failure|<worker id>" when known),
# applied in order. Returns {state, probes left, then each event's transition ("open",
# "close" or "")}.
_STEP = """
local key, by = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local threshold, cooldown, probes = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local distinct = tonumber(ARGV[5])
local state = redis.call('HGET', key, 'state') or 'closed'
local function open()
  redis.call('HSET', key, 'state', 'open', 'opened_at', tostring(now), 'failures', '0',
             'probes_sent', '0', 'probes_ok', '0', 'probes_failed', '0')
  redis.call('DEL', by)
  state = 'open'
  return 'open'
end
local transitions = {}
for at = 6, #ARGV do
  local event, who = string.match(ARGV[at], '^(%a+)|?(.*)$')
  local transition = ''
  if state == 'open' then
    local opened = tonumber(redis.call('HGET', key, 'opened_at') or '0')
    if now - opened >= cooldown then
      redis.call('HSET', key, 'state', 'half_open', 'probes_sent', '0', 'probes_ok', '0',
                 'probed_at', tostring(now))
      state = 'half_open'
    end
  elseif state == 'half_open' then
    -- Probes that never came back (cancelled as a hedge's loser or at a quorum, or their
    -- conductor died) are offered again a cooldown after the last one left: otherwise
    -- the breaker would stay half-open with no probe left, shut for good.
    local sent = tonumber(redis.call('HGET', key, 'probes_sent') or '0')
    local probed = tonumber(redis.call('HGET', key, 'probed_at') or '0')
    if sent >= probes and now - probed >= cooldown then
      redis.call('HSET', key, 'probes_sent', redis.call('HGET', key, 'probes_ok') or '0')
    end
  end
  if event == 'probe' and state == 'half_open' then
    redis.call('HINCRBY', key, 'probes_sent', 1)
    redis.call('HSET', key, 'probed_at', tostring(now))
  elseif event == 'success' then
    if state == 'closed' then
      redis.call('HSET', key, 'failures', '0')
      redis.call('DEL', by)
    elseif state == 'half_open' then
      if redis.call('HINCRBY', key, 'probes_ok', 1) >= probes then
        redis.call('HSET', key, 'state', 'closed', 'failures', '0')
        redis.call('DEL', by)
        state = 'closed'; transition = 'close'
      end
    end
  elseif event == 'failure' then
    if state == 'closed' then
      local failures = redis.call('HINCRBY', key, 'failures', 1)
      if distinct > 1 then
        if who == '' then who = '?' .. failures end
        redis.call('SADD', by, who)
        redis.call('EXPIRE', by, 86400)
      end
      if failures >= threshold and (distinct <= 1 or redis.call('SCARD', by) >= distinct) then
        transition = open()
      end
    elseif state == 'half_open' and distinct > 1 then
      -- A venue's probe failed: the venue is down once probes of several workers fail;
      -- one worker's failure gives its probe back, for another worker to try.
      if who == '' then who = '?' .. redis.call('HINCRBY', key, 'probes_failed', 1) end
      redis.call('SADD', by, who)
      redis.call('EXPIRE', by, 86400)
      if redis.call('SCARD', by) >= distinct then
        transition = open()
      elseif tonumber(redis.call('HGET', key, 'probes_sent') or '0') > 0 then
        -- (a failure of a job sent before the breaker opened gives back no probe)
        redis.call('HINCRBY', key, 'probes_sent', -1)
      end
    elseif state == 'half_open' then
      transition = open()
    end
  end
  transitions[#transitions + 1] = transition
end
local left = 0
if state == 'half_open' then
  left = probes - tonumber(redis.call('HGET', key, 'probes_sent') or '0')
end
redis.call('EXPIRE', key, 86400)
local reply = {state, left}
for _, transition in ipairs(transitions) do reply[#reply + 1] = transition end
return reply
"""
_STEP_SCRIPT = LuaScript(_STEP)


def circuit_key(scope: str) -> str:
    """`scope` is "worker:<id>" or "venue:<name>"."""
    return f"frlm:circuit:{scope}"


def failers_key(scope: str) -> str:
    """The workers whose failures are in the breaker's current run of them."""
    return f"frlm:circuit:{scope}:by"


@dataclass(frozen=True)
class Step:
    scope: str
    state: str
    transition: str  # "open", "close" or ""
    probes_left: int


class Breakers:
    """The breakers one fanout consults, read and updated in batched round trips."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        failures: int | None = None,
        cooldown_s: float | None = None,
        probes: int | None = None,
        venue_failures: int | None = None,
        venue_workers: int | None = None,
    ) -> None:
        self.client = client
        self.failures = failures or settings.FRLM_CIRCUIT_FAILURES
        self.venue_failures = venue_failures or settings.FRLM_CIRCUIT_VENUE_FAILURES
        self.venue_workers = venue_workers or settings.FRLM_CIRCUIT_VENUE_WORKERS
        self.cooldown_s = cooldown_s if cooldown_s is not None else settings.FRLM_CIRCUIT_COOLDOWN_S
        self.probes = probes or settings.FRLM_CIRCUIT_PROBES
        self.state: dict[str, Step] = {}
        self._pending: list[tuple[str, str]] = []

    def allows(self, scope: str) -> bool:
        step = self.state.get(scope)
        if step is None or step.state == CLOSED:
            return True
        return step.state == HALF_OPEN and step.probes_left > 0

    def dispatched(self, scope: str) -> None:
        """A sub-query was sent through this breaker; counts as a probe when half-open."""
        step = self.state.get(scope)
        if step is not None and step.state == HALF_OPEN:
            self.state[scope] = Step(scope, HALF_OPEN, "", step.probes_left - 1)
            self._pending.append((scope, "probe"))

    def threshold(self, scope: str) -> int:
        """Consecutive failures that open this breaker."""
        return self.venue_failures if scope.startswith("venue:") else self.failures

    def record(self, scope: str, ok: bool, *, by: str = "") -> None:
        """An attempt through this breaker ended; `by` is the worker that failed it, when
        known (a venue's breaker opens only on failures of several)."""
        self._pending.append((scope, "success" if ok else f"failure|{by}" if by else "failure"))

    def check(self, scopes: list[str], now: float) -> list[Step]:
        for scope in scopes:
            self._pending.append((scope, "check"))
        return self.flush(now)

    def flush(self, now: float) -> list[Step]:
        """Apply what happened since the last flush, one script call per breaker with its
        events in order (every dispatch and reply of a batch was one call each, the
        script's body sent every time); returns the transitions it made, in the order of
        the events that made them."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        by_scope: dict[str, list[int]] = {}
        for index, (scope, _event) in enumerate(pending):
            by_scope.setdefault(scope, []).append(index)
        pipe = self.client.pipeline(transaction=False)
        for scope, indexes in by_scope.items():
            venue = scope.startswith("venue:")
            _STEP_SCRIPT(
                keys=[circuit_key(scope), failers_key(scope)],
                args=[
                    repr(now),
                    self.threshold(scope),
                    self.cooldown_s,
                    self.probes,
                    self.venue_workers if venue else 1,
                ]
                + [pending[i][1] for i in indexes],
                client=pipe,
            )
        made: list[tuple[int, Step]] = []
        for (scope, indexes), reply in zip(by_scope.items(), pipe.execute(), strict=True):
            state, left, *transitions = (x.decode() if isinstance(x, bytes) else x for x in reply)
            self.state[scope] = Step(scope, state, "", int(left))
            for index, transition in zip(indexes, transitions, strict=True):
                if transition:
                    after = OPEN if transition == "open" else CLOSED
                    made.append((index, Step(scope, after, transition, 0)))
        return [step for _, step in sorted(made, key=lambda pair: pair[0])]
