"""Circuit breakers per worker and per venue: after FAILURES consecutive failures a circuit
opens and nothing is sent there; after COOLDOWN_S it is half-open and PROBES sub-queries
are let through; if they all succeed it closes, if one fails it opens again.

State lives in Redis so that every conductor sees the same breaker, and transitions are
made by a Lua script, so exactly one caller sees each transition and emits its event."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from django.conf import settings

from frlm_web.redis_client import LuaScript

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

# KEYS[1]: the breaker. ARGV: now, failures to open, cooldown seconds, probes, then the
# events (check|probe|success|failure), applied in order. Returns {state, probes left,
# then each event's transition ("open", "close" or "")}.
_STEP = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local threshold, cooldown, probes = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HGET', key, 'state') or 'closed'
local function open()
  redis.call('HSET', key, 'state', 'open', 'opened_at', tostring(now), 'failures', '0',
             'probes_sent', '0', 'probes_ok', '0')
  state = 'open'
  return 'open'
end
local transitions = {}
for at = 5, #ARGV do
  local event = ARGV[at]
  local transition = ''
  if state == 'open' then
    local opened = tonumber(redis.call('HGET', key, 'opened_at') or '0')
    if now - opened >= cooldown then
      redis.call('HSET', key, 'state', 'half_open', 'probes_sent', '0', 'probes_ok', '0')
      state = 'half_open'
    end
  end
  if event == 'probe' and state == 'half_open' then
    redis.call('HINCRBY', key, 'probes_sent', 1)
  elseif event == 'success' then
    if state == 'closed' then
      redis.call('HSET', key, 'failures', '0')
    elseif state == 'half_open' then
      if redis.call('HINCRBY', key, 'probes_ok', 1) >= probes then
        redis.call('HSET', key, 'state', 'closed', 'failures', '0')
        state = 'closed'; transition = 'close'
      end
    end
  elseif event == 'failure' then
    if state == 'closed' then
      if redis.call('HINCRBY', key, 'failures', 1) >= threshold then transition = open() end
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
    ) -> None:
        self.client = client
        self.failures = failures or settings.FRLM_CIRCUIT_FAILURES
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

    def record(self, scope: str, ok: bool) -> None:
        self._pending.append((scope, "success" if ok else "failure"))

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
            _STEP_SCRIPT(
                keys=[circuit_key(scope)],
                args=[repr(now), self.failures, self.cooldown_s, self.probes]
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
