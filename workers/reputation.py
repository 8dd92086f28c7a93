"""What the fleet has learned about each worker: Beta scores with forgetting for completion,
agreement and validation, BOINC's consecutive-valid count, consecutive failures and an
EWMA of latency, and strikes that halve every FRLM_STRIKE_HALF_LIFE_S. Kept in Redis,
updated atomically by Lua scripts, so every conductor learns from every other."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import redis
from django.conf import settings

from frlm_web.redis_client import LuaScript

Signal = Literal["completion", "agreement", "validation"]
SIGNALS: tuple[Signal, ...] = ("completion", "agreement", "validation")

# Each observation first shrinks what was known towards the prior: about the last 50
# observations count, so a worker that starts lying is found out, and one that mends its
# ways can earn its place back.
DECAY = 0.98
LATENCY_ALPHA = 0.2
# Counts below which a signal is not yet evidence: a new worker is trusted until it
# has been seen, then judged on what it did.
MIN_EVIDENCE = 0.5

# One proven lie (a wrong agreement or validation verdict) weighs this many good results:
# slow to earn, fast to lose. With DECAY a record holds at most about 50 good results, so
# one lie takes a worker's score below the scheduler's min_reputation at once, and it
# earns its way back only slowly (issue 23). A run's policy.lie_penalty sets it.
LIE_PENALTY = 250.0

# KEYS[1]: the worker's hash. ARGV: decay, alpha, the weight of a failed agreement or
# validation, then five per observation, applied in order: completion, agreement,
# validation, latency_ms ("" for a signal not observed) and the time of the latency sample
# (epoch seconds). Returns the hash after the last.
_OBSERVE = """
local key = KEYS[1]
local decay = tonumber(ARGV[1])
local alpha = tonumber(ARGV[2])
local lie = tonumber(ARGV[3])
local names = {'completion', 'agreement', 'validation'}
for at = 4, #ARGV, 5 do
  for i, name in ipairs(names) do
    local v = ARGV[at + i - 1]
    if v ~= '' then
      v = tonumber(v)
      local a = tonumber(redis.call('HGET', key, name .. '_a') or '1')
      local b = tonumber(redis.call('HGET', key, name .. '_b') or '1')
      local weight = 1
      if name ~= 'completion' then weight = lie end
      a = 1 + (a - 1) * decay + v
      b = 1 + (b - 1) * decay + (1 - v) * weight
      redis.call('HSET', key, name .. '_a', tostring(a), name .. '_b', tostring(b))
      if name == 'completion' then
        if v >= 0.5 then redis.call('HSET', key, 'failures', '0')
        else redis.call('HINCRBY', key, 'failures', 1) end
      else
        if v >= 0.5 then redis.call('HINCRBY', key, 'consecutive_valid', 1)
        else redis.call('HSET', key, 'consecutive_valid', '0') end
      end
    end
  end
  local lat = ARGV[at + 3]
  if lat ~= '' then
    lat = tonumber(lat)
    local old = redis.call('HGET', key, 'latency_ms')
    if old then lat = alpha * lat + (1 - alpha) * tonumber(old) end
    redis.call('HSET', key, 'latency_ms', tostring(lat))
    if ARGV[at + 4] ~= '' then redis.call('HSET', key, 'latency_at', ARGV[at + 4]) end
    redis.call('HINCRBY', key, 'samples', 1)
  end
end
return redis.call('HGETALL', key)
"""
_OBSERVE_SCRIPT = LuaScript(_OBSERVE)


def rep_key(worker_id: str) -> str:
    return f"frlm:rep:{worker_id}"


# A worker whose agreement or validation record (its mean) is below this has been caught
# lying lately: the checking tiers check all of its answers until the record mends.
SUSPECT_BELOW = 0.5


@dataclass(frozen=True)
class Reputation:
    worker_id: str
    completion_a: float = 1.0
    completion_b: float = 1.0
    agreement_a: float = 1.0
    agreement_b: float = 1.0
    validation_a: float = 1.0
    validation_b: float = 1.0
    consecutive_valid: int = 0
    failures: int = 0  # consecutive failed completions
    latency_ms: float | None = None  # EWMA of observed latency
    latency_at: float | None = None  # when it was last measured (epoch seconds)
    samples: int = 0
    strikes: float = 0.0  # forged results and attestations, fading with their half-life

    def mean(self, signal: Signal) -> float | None:
        """The share of good results in a signal's evidence, the prior counting as one good
        result and no bad one, or None while there is no evidence on it. Good results alone
        keep it at 1: with the Beta(1, 1) mean a worker that passed one probe scored 2/3 on
        validation while one never probed scored 1, so passing probes cost a worker half
        its share of an honest swarm's work (issue 23). One lie still counts in full."""
        a = getattr(self, f"{signal}_a")
        b = getattr(self, f"{signal}_b")
        if a + b - 2 < MIN_EVIDENCE:
            return None
        return a / (a + b - 1)

    @property
    def suspect(self) -> bool:
        """Caught lying lately: its agreement or validation record is under SUSPECT_BELOW
        (one proven lie weighs lie_penalty good results). Every answer of it is checked,
        and it is not explored (runs/engine/fanout/routing.py)."""
        means = (self.mean("validation"), self.mean("agreement"))
        return any(m is not None and m < SUSPECT_BELOW for m in means)

    @property
    def score(self) -> float:
        """In (0, 1]: the product of the signals with evidence, each strike halving it.
        A worker nobody has seen yet scores 1: exploration and evidence correct it."""
        value = 1.0
        for signal in SIGNALS:
            mean = self.mean(signal)
            if mean is not None:
                value *= mean
        return value * 0.5 ** min(self.strikes, 20)

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "score": round(self.score, 4),
            "completion": _round(self.mean("completion")),
            "agreement": _round(self.mean("agreement")),
            "validation": _round(self.mean("validation")),
            "consecutive_valid": self.consecutive_valid,
            "failures": self.failures,
            "latency_ms": _round(self.latency_ms, 1),
            "strikes": round(self.strikes, 2),
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _parse(
    worker_id: str, flat: dict[bytes, bytes] | list[bytes], strikes: float = 0.0
) -> Reputation:
    if isinstance(flat, list):
        flat = dict(zip(flat[::2], flat[1::2], strict=True))
    data = {k.decode(): v.decode() for k, v in flat.items()}
    floats = {
        name: float(data[name])
        for name in (f"{s}_{p}" for s in SIGNALS for p in "ab")
        if name in data
    }
    return Reputation(
        worker_id=worker_id,
        **floats,
        consecutive_valid=int(data.get("consecutive_valid", 0)),
        failures=int(data.get("failures", 0)),
        latency_ms=float(data["latency_ms"]) if "latency_ms" in data else None,
        latency_at=float(data["latency_at"]) if "latency_at" in data else None,
        samples=int(data.get("samples", 0)),
        strikes=strikes,
    )


def strikes_key(worker_id: str) -> str:
    return f"frlm:worker:{worker_id}:strikes"


def credit_key(worker_id: str) -> str:
    """What the gateway lets the worker hold (workers/gateway/credit.py)."""
    return f"frlm:worker:{worker_id}:credit"


def heir_key(worker_id: str) -> str:
    """The earlier registration of the same key whose reputation this worker takes on."""
    return f"frlm:worker:{worker_id}:heir_of"


# --- a worker registered again takes on its record --------------------------------------
# A restart registers a new worker (a new id: the conductor must see the old process gone),
# and every record was the id's: a liar caught at reputation 0 came back with none and got
# work again (a federation review). So a registration with the key of an earlier one of the
# venue takes on its record: its strikes and its gateway credit at once (the web server that
# registers may write them), its reputation when a conductor first meets it (only they may
# write reputations): `heir_key` names the earlier id until then.
HEIR_KEEP_S = 30 * 86400
_INHERIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  local h = redis.call('HGETALL', KEYS[2])
  if #h > 0 then redis.call('HSET', KEYS[1], unpack(h)) end
end
redis.call('DEL', KEYS[3])
return 1
"""
_INHERIT_SCRIPT = LuaScript(_INHERIT)


def record_bequeath(client: redis.Redis, earlier: str, worker_id: str) -> None:
    """`worker_id` takes on `earlier`'s record: strikes and credit now (as they stand, with
    the time they had left), its reputation at a conductor's next look (Reputations)."""
    keys = (strikes_key, credit_key)
    pipe = client.pipeline(transaction=False)
    for key_of in keys:
        pipe.get(key_of(earlier))
        pipe.pttl(key_of(earlier))
    pipe.get(heir_key(earlier))
    replies = pipe.execute()
    # One no conductor met yet holds no reputation of its own, only its heir_of: the record
    # is that one's (a review laundered a liar's record through a name never connected).
    pending = replies[-1]
    source = (pending.decode() if isinstance(pending, bytes) else pending) or earlier
    pipe = client.pipeline(transaction=False)
    for i, key_of in enumerate(keys):
        value, ttl = replies[2 * i], replies[2 * i + 1]
        if value is not None:
            pipe.set(key_of(worker_id), value, px=ttl if ttl > 0 else None)
    pipe.set(heir_key(worker_id), source, ex=HEIR_KEEP_S)
    pipe.execute()


# A worker's strikes are kept as "<count>@<epoch seconds>": the count as it stood then.
# Reading decays it to now; a strike decays it and adds one, so a worker that forged once
# long ago is not halved for ever (the other terms forget too). The key expires once what
# is left no longer matters. A bare number (written before strikes decayed) reads as is.
# KEYS[1]: the strikes key. ARGV: now, half-life in seconds. Returns the count after it.
_STRIKE = """
local raw = redis.call('GET', KEYS[1])
local now = tonumber(ARGV[1])
local half = tonumber(ARGV[2])
local count = 0
if raw then
  local n, at = string.match(raw, '^([^@]+)@(.+)$')
  if n then count = tonumber(n) * math.pow(0.5, math.max(0, now - tonumber(at)) / half)
  else count = tonumber(raw) or 0 end
end
count = count + 1
local ttl = math.max(1, math.ceil(half * 30))
redis.call('SET', KEYS[1], string.format('%.17g@%.6f', count, now), 'EX', ttl)
return string.format('%.17g', count)
"""
_STRIKE_SCRIPT = LuaScript(_STRIKE)


def _half_life_s() -> float:
    return max(1e-3, float(settings.FRLM_STRIKE_HALF_LIFE_S))


def strike_add(client: redis.Redis, worker_id: str, now: float | None = None) -> float:
    """One more strike against the worker; its strikes after it, decayed to now."""
    now = time.time() if now is None else now
    reply = _STRIKE_SCRIPT(
        keys=[strikes_key(worker_id)], args=[repr(now), repr(_half_life_s())], client=client
    )
    return float(reply.decode() if isinstance(reply, bytes) else reply)


def strikes_at(raw: bytes | str | None, now: float | None = None) -> float:
    """The strikes in a stored value, decayed to `now`."""
    if not raw:
        return 0.0
    text = raw.decode() if isinstance(raw, bytes) else raw
    count, sep, at = text.partition("@")
    try:
        if not sep:
            return float(count)
        now = time.time() if now is None else now
        return float(count) * 0.5 ** (max(0.0, now - float(at)) / _half_life_s())
    except ValueError:
        return 0.0


def load(client: redis.Redis, worker_ids: list[str]) -> dict[str, Reputation]:
    """Every named worker's reputation in one round trip."""
    if not worker_ids:
        return {}
    pipe = client.pipeline(transaction=False)
    for wid in worker_ids:
        pipe.hgetall(rep_key(wid))
        pipe.get(strikes_key(wid))
    replies = pipe.execute()
    now = time.time()
    return {
        wid: _parse(wid, replies[2 * i], strikes_at(replies[2 * i + 1], now))
        for i, wid in enumerate(worker_ids)
    }


@dataclass(frozen=True)
class Observation:
    worker_id: str
    completion: bool | None = None  # it returned a result (True) or failed / timed out
    agreement: bool | None = None  # its result agreed with the accepted one
    validation: bool | None = None  # a validator or an objective check passed it
    latency_ms: float | None = None


def _arg(value: bool | None) -> str:
    return "" if value is None else ("1" if value else "0")


class Reputations:
    """Records observations in Redis, batched into one round trip per flush, and keeps
    each worker's latest reputation for the scheduler."""

    def __init__(self, client: redis.Redis, lie_penalty: float = 1.0) -> None:
        self.client = client
        self.lie_penalty = lie_penalty  # the weight of one failed agreement or validation
        self._pending: list[Observation] = []
        self.known: dict[str, Reputation] = {}
        self._met: set[str] = set()  # workers whose inheritance was looked for

    def observe(self, observation: Observation) -> None:
        self._pending.append(observation)

    def refresh(self, worker_ids: list[str]) -> None:
        self.flush()
        self._inherit(worker_ids)
        self.known.update(load(self.client, worker_ids))

    def _inherit(self, worker_ids: list[str]) -> None:
        """Workers met for the first time take on the reputation of the earlier registration
        their key had (record_bequeath), unless they have one of their own already."""
        new = [wid for wid in worker_ids if wid not in self._met]
        if not new:
            return
        self._met.update(new)
        pipe = self.client.pipeline(transaction=False)
        for wid in new:
            pipe.get(heir_key(wid))
        heirs = pipe.execute()
        pipe = self.client.pipeline(transaction=False)
        for wid, earlier in zip(new, heirs, strict=True):
            if earlier:
                old = earlier.decode() if isinstance(earlier, bytes) else earlier
                keys = [rep_key(wid), rep_key(old), heir_key(wid)]
                _INHERIT_SCRIPT(keys=keys, args=[], client=pipe)
        pipe.execute()

    def flush(self) -> list[Reputation]:
        """Apply the observations since the last flush: one script call per worker, its
        observations in the order they were made (a worker's reply of a batch of 256 was
        one call each, the script's body sent every time). Returns each worker's
        reputation after them."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        by_worker: dict[str, list[str]] = {}
        now = repr(time.time())
        for obs in pending:
            latency = "" if obs.latency_ms is None else repr(float(obs.latency_ms))
            by_worker.setdefault(obs.worker_id, []).extend(
                [
                    _arg(obs.completion),
                    _arg(obs.agreement),
                    _arg(obs.validation),
                    latency,
                    now if latency else "",
                ]
            )
        pipe = self.client.pipeline(transaction=False)
        for worker_id, args in by_worker.items():
            _OBSERVE_SCRIPT(
                keys=[rep_key(worker_id)],
                args=[DECAY, LATENCY_ALPHA, repr(float(self.lie_penalty)), *args],
                client=pipe,
            )
        updated = []
        for worker_id, flat in zip(by_worker, pipe.execute(), strict=True):
            strikes = self.known[worker_id].strikes if worker_id in self.known else 0.0
            rep = _parse(worker_id, flat, strikes)
            self.known[worker_id] = rep
            updated.append(rep)
        return updated

    def get(self, worker_id: str) -> Reputation:
        return self.known.get(worker_id) or Reputation(worker_id)
