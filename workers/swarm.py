"""A simulated swarm: N registered workers backed by the simulated model, each its own
process with its own device profile drawn from a profile file, leaving and rejoining as the
profile's churn says. What runs is the real worker runtime (`frlm_worker`): only the model
behind it is simulated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


class ProfileFileError(ValueError):
    """The profile file is missing or malformed; the message says what to fix."""


@dataclass(frozen=True)
class SwarmProfile:
    name: str
    description: str = ""
    concurrency: int = 4
    context_tokens: int = 32_000
    median_ms: float = 150.0
    spread: float = 0.25
    slow_share: float = 0.0
    slow_factor: float = 1.0
    straggler_rate: float = 0.0
    straggler_factor: float = 10.0
    failure_rate: float = 0.0
    lie_share: float = 0.0
    lie_rate: float = 0.0
    lie_after_s: float = 0.0  # liars are honest this long after starting (0: from the start)
    # Liars answer honestly the first this many jobs they begin after a pause (0: off):
    # they know a batch's first answer is the one the check gate took (issue 23).
    honest_first: int = 0
    collude: float = 0.0  # share of lies that are the liars' shared lie (identical answers)
    leave_every_s: float = 0.0
    away_s: float = 5.0
    kill_share: float = 0.5
    in_per_1k: float = 0.0
    out_per_1k: float = 0.0


INTEGERS = ("concurrency", "context_tokens", "honest_first")
# Where each setting sits in the file, and the range it must fall in.
_LAYOUT: dict[str, tuple[str | None, float, float]] = {
    "concurrency": (None, 1, 1024),
    "context_tokens": (None, 1, 10_000_000),
    "median_ms": ("latency", 0, 600_000),
    "spread": ("latency", 0, 5),
    "slow_share": ("latency", 0, 1),
    "slow_factor": ("latency", 1, 1000),
    "straggler_rate": ("faults", 0, 1),
    "straggler_factor": ("faults", 1, 1000),
    "failure_rate": ("faults", 0, 1),
    "lie_share": ("faults", 0, 1),
    "lie_rate": ("faults", 0, 1),
    "lie_after_s": ("faults", 0, 86_400),
    "honest_first": ("faults", 0, 1024),
    "collude": ("faults", 0, 1),
    "leave_every_s": ("churn", 0, 86_400),
    "away_s": ("churn", 0, 86_400),
    "kill_share": ("churn", 0, 1),
    "in_per_1k": ("price", 0, 1000),
    "out_per_1k": ("price", 0, 1000),
}


def profile_path(name: str) -> Path:
    """A shipped profile by name (workers/profiles/NAME.toml) or a file path."""
    path = Path(name).expanduser()
    if path.suffix == ".toml" or os.sep in name:
        return path
    return PROFILE_DIR / f"{name}.toml"


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def profile_load(name: str) -> SwarmProfile:
    path = profile_path(name)
    if not path.is_file():
        raise ProfileFileError(
            f"no swarm profile {name!r} (looked for {path}); shipped profiles: "
            f"{', '.join(profile_names())}, or give the path of a .toml file"
        )
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileFileError(f"{path} is not valid TOML: {exc}") from exc
    values: dict[str, Any] = {}
    problems = _unknown_keys(data)
    for key, (section, low, high) in _LAYOUT.items():
        table = data if section is None else data.get(section, {})
        if not isinstance(table, dict) or key not in table:
            continue
        raw = table[key]
        where = key if section is None else f"[{section}] {key}"
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            problems.append(f"{where} must be a number, got {raw!r}")
        elif not low <= raw <= high:
            problems.append(f"{where} must be between {low:g} and {high:g}, got {raw}")
        else:
            values[key] = int(raw) if key in INTEGERS else float(raw)
    if problems:
        raise ProfileFileError(f"{path}: " + "; ".join(problems))
    return SwarmProfile(name=path.stem, description=str(data.get("description", "")), **values)


def _unknown_keys(data: dict[str, Any]) -> list[str]:
    """What a profile holds that no key of _LAYOUT is: a typo, or a key in the wrong table,
    which was ignored and left the default in force (found by a review)."""
    sections = {section for section, _low, _high in _LAYOUT.values() if section is not None}
    known = {(section, key) for key, (section, _low, _high) in _LAYOUT.items()}
    problems = []
    for name, value in data.items():
        if name == "description" or (None, name) in known:
            continue
        if name in sections and isinstance(value, dict):
            problems += [
                f"[{name}] {key} is not a profile key" + _belongs(key)
                for key in value
                if (name, key) not in known
            ]
        else:
            problems.append(f"{name} is not a profile key" + _belongs(name))
    return problems


def _belongs(key: str) -> str:
    """Where a known key goes, for one found elsewhere."""
    if key not in _LAYOUT:
        return f" (known: {', '.join(sorted(_LAYOUT))})"
    section = _LAYOUT[key][0]
    return " (it goes at the top)" if section is None else f" (it goes under [{section}])"


@dataclass(frozen=True)
class Device:
    """One worker of the swarm: its name and the simulated model's behaviour behind it."""

    name: str
    slow: bool
    liar: bool
    sim: dict[str, float]

    def describe(self) -> str:
        tags = [f"{self.sim['latency_ms']:.0f} ms"]
        if self.slow:
            tags.append("slow")
        if self.liar:
            tags.append(f"lies {self.sim['lie_rate']:.0%}")
        return f"{self.name}: {', '.join(tags)}"


def devices(profile: SwarmProfile, venue: str, count: int, seed: int) -> list[Device]:
    """The swarm's devices, the same for the same seed. Exactly round(share * count) are slow
    and round(share * count) lie, chosen at random."""
    rng = random.Random(f"{profile.name}:{venue}:{seed}")
    order = list(range(count))
    slow = set(rng.sample(order, round(profile.slow_share * count)))
    liars = set(rng.sample(order, round(profile.lie_share * count)))
    out = []
    for i in range(count):
        median = profile.median_ms * (profile.slow_factor if i in slow else 1.0)
        out.append(
            Device(
                name=f"{venue}-{profile.name}-{i + 1}",
                slow=i in slow,
                liar=i in liars,
                sim={
                    "latency_ms": round(median, 1),
                    "spread": profile.spread,
                    "straggler_rate": profile.straggler_rate,
                    "straggler_factor": profile.straggler_factor,
                    "failure_rate": profile.failure_rate,
                    "lie_rate": profile.lie_rate if i in liars else 0.0,
                    **({"collude": profile.collude} if i in liars and profile.collude else {}),
                    "seed": seed * 1000 + i,
                    **(
                        {"lie_after_s": profile.lie_after_s}
                        if i in liars and profile.lie_after_s
                        else {}
                    ),
                    **(
                        {"honest_first": profile.honest_first}
                        if i in liars and profile.honest_first
                        else {}
                    ),
                },
            )
        )
    return out


def worker_argv(device: Device, profile: SwarmProfile, venue: str) -> list[str]:
    argv = [
        sys.executable,
        str(Path(settings.BASE_DIR) / "manage.py"),
        "frlm_worker",
        "--venue",
        venue,
        "--name",
        device.name,
        "--concurrency",
        str(profile.concurrency),
        "--context-tokens",
        str(profile.context_tokens),
        "--price-in",
        repr(profile.in_per_1k),
        "--price-out",
        repr(profile.out_per_1k),
    ]
    for key, value in device.sim.items():
        argv += [f"--sim-{key.replace('_', '-')}", repr(value)]
    return argv


@dataclass
class Member:
    device: Device
    argv: list[str]
    popen: subprocess.Popen | None = None
    back_at: float = 0.0  # when a departed member rejoins
    departures: int = 0
    log: list[str] = field(default_factory=list)


class Swarm:
    """Starts the devices, keeps them running, and makes them churn."""

    def __init__(
        self,
        profile: SwarmProfile,
        venue: str,
        count: int,
        *,
        seed: int = 0,
        log_dir: Path | None = None,
        say: Any = print,
    ) -> None:
        self.profile = profile
        self.venue = venue
        self.members = [
            Member(d, worker_argv(d, profile, venue)) for d in devices(profile, venue, count, seed)
        ]
        self.rng = random.Random(seed)
        self.log_dir = log_dir
        self.say = say
        self.stopping = False
        self.next_departure = self._draw_departure(time.monotonic())

    def _draw_departure(self, now: float) -> float:
        if self.profile.leave_every_s <= 0:
            return float("inf")
        return now + self.rng.expovariate(1 / self.profile.leave_every_s)

    def start(self) -> None:
        for member in self.members:
            self._launch(member)

    def _launch(self, member: Member) -> None:
        out = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{member.device.name}.log", "ab")  # noqa: SIM115
        member.popen = subprocess.Popen(
            member.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=settings.BASE_DIR,
            # In the swarm's process group: whoever stops the swarm's group stops them too.
        )
        if out is not subprocess.DEVNULL:
            out.close()

    def tick(self, now: float) -> None:
        """Rejoin who is due back, restart who crashed, and send one away when it is time."""
        for member in self.members:
            if member.popen is None and now >= member.back_at:
                self.say(f"{member.device.name} rejoins")
                self._launch(member)
            elif member.popen is not None and member.popen.poll() is not None:
                self.say(
                    f"{member.device.name} exited with code {member.popen.returncode}; restarting"
                )
                self._launch(member)
        if now >= self.next_departure:
            self.next_departure = self._draw_departure(now)
            present = [m for m in self.members if m.popen is not None]
            if present:
                self._depart(self.rng.choice(present), now)

    def _depart(self, member: Member, now: float) -> None:
        hard = self.rng.random() < self.profile.kill_share
        self.say(
            f"{member.device.name} leaves {'without a word (SIGKILL)' if hard else '(SIGTERM)'}"
        )
        self._stop_member(member, signal.SIGKILL if hard else signal.SIGTERM)
        member.departures += 1
        member.back_at = now + self.profile.away_s

    def _stop_member(self, member: Member, sig: int) -> None:
        if member.popen is None:
            return
        _signal(member.popen, sig)
        try:
            member.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _signal(member.popen, signal.SIGKILL)
            member.popen.wait()
        member.popen = None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to all at once (each finishes its work and deregisters), SIGKILL to any
        still there after the grace period."""
        self.stopping = True
        running = [m for m in self.members if m.popen is not None and m.popen.poll() is None]
        for member in running:
            _signal(member.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for member in running:
            try:
                member.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(member.popen, signal.SIGKILL)
                member.popen.wait()
        for member in self.members:
            member.popen = None


def _signal(popen: subprocess.Popen, sig: int) -> None:
    try:
        popen.send_signal(sig)
    except ProcessLookupError:
        pass
