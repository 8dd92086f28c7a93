"""An experiment suite: which tasks, which baselines, which seeds, on which federation.

A suite is built in ("small", "default") or a JSON/TOML file of the same shape:

    {"name": "mine",
     "tasks": [{"family": "sniah", "tokens": 8000, "count": 2}],
     "baselines": ["local_only", "fed_redundancy"],
     "seeds": [0, 1],
     "federation": {
        "local": "xp-local", "premium": "xp-dc",
        "venues": [
          {"name": "xp-local", "workers": 1, "profile": "datacenter", "trusted": true},
          {"name": "xp-edge", "workers": 4,
           "profile": {"latency": {"median_ms": 120}, "faults": {"lie_share": 0.25}}},
          {"name": "xp-dc", "workers": 1, "profile": "datacenter", "trusted": true}]},
     "policy": {"max_turns": 4},
     "endpoint": null, "model": null, "timeout_s": 300, "tune_baseline": "fed_redundancy"}

A venue's profile is a shipped swarm profile's name (workers/profiles), a .toml path, or a
table in the profile file's layout (workers/swarm.py): latency, stragglers, failures, liars
and colluders, churn and prices. Every problem is reported in one line that says what to fix.
"""

from __future__ import annotations

import json
import re
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runs.engine.policy import Policy, PolicyError
from runs.taskgen import MAX_TOKENS, MIN_TOKENS, TASKS
from workers.swarm import _LAYOUT, ProfileFileError, profile_load, profile_path

# The baselines of the FRLM paper, each as the run policy it means. `venues` says where
# its sub-queries run: "local" (the federation's local venue only) or "federation" (every
# venue but the premium lane). The premium lane's venue fills in `premium_venues`.
BASELINES: dict[str, dict[str, Any]] = {
    "rlm_sequential": {
        "venues": "local",
        "policy": {"max_inflight": 1, "hedge": "off", "tier": "best_effort"},
        "about": "RLM: sub-calls one after another on the local venue",
    },
    "local_only": {
        "venues": "local",
        "policy": {"tier": "best_effort"},
        "about": "FRLM without federation: parallel sub-queries on the local venue",
    },
    "fed_best_effort": {
        "venues": "federation",
        "policy": {"tier": "best_effort"},
        "about": "federated, each reply taken as it comes",
    },
    "fed_redundancy": {
        "venues": "federation",
        "policy": {"tier": "redundant", "replicas": 2, "agree": 2},
        "about": "federated, copies on distinct workers must agree",
    },
    "fed_validator": {
        "venues": "federation",
        "policy": {"tier": "high_trust"},
        "about": "federated, a trusted validator re-runs a sample and attests",
    },
    "fed_premium": {
        "venues": "federation",
        "policy": {"tier": "best_effort", "premium_steps": "both"},
        "about": "federated, merges and retries on the premium datacenter lane",
    },
}

_VENUE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_SUITE_KEYS = {
    "name",
    "tasks",
    "baselines",
    "seeds",
    "federation",
    "policy",
    "endpoint",
    "model",
    "timeout_s",
    "tune_baseline",
}


class SuiteError(ValueError):
    """The suite cannot be used; the message is one line saying what to fix."""


@dataclass(frozen=True)
class TaskSpec:
    family: str
    tokens: int
    count: int = 1


@dataclass(frozen=True)
class VenueDef:
    name: str
    workers: int = 1
    profile: str = "edge"  # a shipped profile's name or a .toml path
    inline: dict[str, Any] = field(default_factory=dict)  # a profile given in the suite
    trusted: bool = False


@dataclass(frozen=True)
class Suite:
    name: str
    tasks: tuple[TaskSpec, ...]
    baselines: tuple[str, ...]
    seeds: tuple[int, ...]
    venues: tuple[VenueDef, ...]
    local: str
    premium: str
    policy: dict[str, Any] = field(default_factory=dict)
    endpoint: str | None = None
    model: str | None = None  # the model's name at the endpoint
    timeout_s: float = 300.0
    tune_baseline: str = "fed_redundancy"

    def to_dict(self) -> dict[str, Any]:
        """The suite as resolved, in the file's shape: load_suite reads it back."""
        data = asdict(self)
        data["federation"] = {
            "local": data.pop("local"),
            "premium": data.pop("premium"),
            "venues": [
                {
                    "name": v.name,
                    "workers": v.workers,
                    "profile": v.inline or v.profile,
                    "trusted": v.trusted,
                }
                for v in self.venues
            ],
        }
        del data["venues"]
        return data

    def baseline_venues(self, baseline: str) -> list[str]:
        if BASELINES[baseline]["venues"] == "local":
            return [self.local]
        return [v.name for v in self.venues if v.name != self.premium]

    def baseline_policy(self, baseline: str) -> dict[str, Any]:
        """The run policy of `baseline` in this suite: the suite's own keys, then the
        baseline's (the premium lane named for fed_premium)."""
        policy = {**self.policy, **BASELINES[baseline]["policy"]}
        if baseline == "fed_premium":
            policy["premium_venues"] = self.premium
        return policy

    def runs_count(self) -> int:
        return sum(t.count for t in self.tasks) * len(self.baselines) * len(self.seeds)


_SMALL: dict[str, Any] = {
    "name": "small",
    "tasks": [
        {"family": "sniah", "tokens": 24000, "count": 1},
        {"family": "repoqa", "tokens": 12000, "count": 1},
    ],
    "baselines": list(BASELINES),
    "seeds": [0, 1],
    "federation": {
        "local": "xp-local",
        "premium": "xp-dc",
        "venues": [
            {"name": "xp-local", "workers": 1, "profile": "datacenter", "trusted": True},
            {
                "name": "xp-edge",
                "workers": 3,
                "profile": {
                    "concurrency": 4,
                    "latency": {
                        "median_ms": 60,
                        "spread": 0.3,
                        "slow_share": 0.34,
                        "slow_factor": 3.0,
                    },
                    "faults": {
                        "straggler_rate": 0.05,
                        "straggler_factor": 8.0,
                        "failure_rate": 0.02,
                        "lie_share": 0.34,
                        "lie_rate": 0.5,
                    },
                    "price": {"in_per_1k": 0.00005, "out_per_1k": 0.0001},
                },
            },
            {"name": "xp-dc", "workers": 1, "profile": "datacenter", "trusted": True},
        ],
    },
    "policy": {"max_turns": 4, "subquery_timeout_s": 20},
    "timeout_s": 180,
}

_DEFAULT: dict[str, Any] = {
    **_SMALL,
    "name": "default",
    "tasks": [
        {"family": "sniah", "tokens": 48000, "count": 1},
        {"family": "mniah", "tokens": 32000, "count": 1},
        {"family": "oolong", "tokens": 16000, "count": 1},
        {"family": "repoqa", "tokens": 24000, "count": 2},
    ],
    "seeds": [0, 1, 2],
    "federation": {
        "local": "xp-local",
        "premium": "xp-dc",
        "venues": [
            {"name": "xp-local", "workers": 1, "profile": "datacenter", "trusted": True},
            {
                "name": "xp-edge",
                "workers": 4,
                "profile": {
                    "concurrency": 4,
                    "latency": {
                        "median_ms": 80,
                        "spread": 0.3,
                        "slow_share": 0.25,
                        "slow_factor": 3.0,
                    },
                    "faults": {
                        "straggler_rate": 0.05,
                        "straggler_factor": 8.0,
                        "failure_rate": 0.02,
                        "lie_share": 0.25,
                        "lie_rate": 0.6,
                    },
                    "churn": {"leave_every_s": 20.0, "away_s": 4.0, "kill_share": 0.5},
                    "price": {"in_per_1k": 0.00005, "out_per_1k": 0.0001},
                },
            },
            {
                "name": "xp-colluders",
                "workers": 2,
                "profile": {
                    "concurrency": 2,
                    "latency": {"median_ms": 70, "spread": 0.2},
                    "faults": {"lie_share": 1.0, "lie_rate": 0.4, "collude": 1.0},
                    "price": {"in_per_1k": 0.00003, "out_per_1k": 0.00006},
                },
            },
            {"name": "xp-dc", "workers": 1, "profile": "datacenter", "trusted": True},
        ],
    },
    "timeout_s": 240,
}

BUILT_IN = {"small": _SMALL, "default": _DEFAULT}


def load_suite(name_or_path: str | Path) -> Suite:
    """A built-in suite by name, or a suite file (.json or .toml); SuiteError says what to
    fix in one line."""
    text = str(name_or_path)
    if text in BUILT_IN:
        return parse_suite(json.loads(json.dumps(BUILT_IN[text])), where=f"suite {text}")
    path = Path(text).expanduser()
    if not path.is_file():
        raise SuiteError(
            f"no suite {text!r}: give small, default, or the path of a .json or .toml suite file"
        )
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise SuiteError(f"{path} is not valid {kind}: {exc}") from exc
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: a suite file holds one object with tasks, baselines, ...")
    data.setdefault("name", path.stem)
    return parse_suite(data, where=str(path), base=path.parent)


def parse_suite(data: dict[str, Any], *, where: str, base: Path | None = None) -> Suite:
    def fail(message: str) -> SuiteError:
        return SuiteError(f"{where}: {message}")

    unknown = sorted(set(data) - _SUITE_KEYS)
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_SUITE_KEYS))})")
    tasks = tuple(_task(item, i, fail) for i, item in enumerate(_list(data, "tasks", fail)))
    baselines = tuple(_list(data, "baselines", fail))
    for name in baselines:
        if name not in BASELINES:
            raise fail(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})")
    if len(set(baselines)) != len(baselines):
        raise fail("a baseline is listed twice")
    seeds = tuple(_list(data, "seeds", fail))
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise fail(f"seeds must be whole numbers 0 or more, got {list(seeds)!r}")
    venues, local, premium = _federation(data.get("federation"), fail, base)
    policy = data.get("policy") or {}
    if not isinstance(policy, dict):
        raise fail('policy must be an object of policy keys, e.g. {"max_turns": 4}')
    try:
        Policy.from_dict(policy)
    except PolicyError as exc:
        raise fail(str(exc)) from exc
    endpoint = data.get("endpoint") or None
    if endpoint is not None and not re.match(r"https?://", str(endpoint)):
        raise fail(f"endpoint must be an http(s) URL, got {endpoint!r}")
    model = data.get("model") or None
    if model is not None and not isinstance(model, str):
        raise fail(f"model must be the model's name at the endpoint, got {model!r}")
    timeout = data.get("timeout_s", 300)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise fail(f"timeout_s must be a number of seconds above 0, got {timeout!r}")
    fallback = "fed_redundancy" if "fed_redundancy" in baselines else baselines[0]
    tune_baseline = data.get("tune_baseline", fallback)
    if tune_baseline not in baselines:
        raise fail(f"tune_baseline {tune_baseline!r} must be one of the suite's baselines")
    if "fed_premium" in baselines and not premium:
        raise fail("baseline fed_premium needs federation.premium: the premium lane's venue")
    return Suite(
        name=str(data.get("name") or "suite"),
        tasks=tasks,
        baselines=baselines,
        seeds=seeds,
        venues=venues,
        local=local,
        premium=premium,
        policy=policy,
        endpoint=endpoint,
        model=model,
        timeout_s=float(timeout),
        tune_baseline=tune_baseline,
    )


def _list(data: dict[str, Any], key: str, fail: Any) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise fail(f"{key} must be a non-empty list")
    return value


def _task(item: Any, i: int, fail: Any) -> TaskSpec:
    if not isinstance(item, dict):
        raise fail(f"tasks[{i}] must be an object with family, tokens and count")
    family = item.get("family")
    if family not in TASKS:
        raise fail(f"tasks[{i}].family must be one of {', '.join(sorted(TASKS))}, got {family!r}")
    tokens, count = item.get("tokens"), item.get("count", 1)
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise fail(f"tasks[{i}].tokens must be a whole number, got {tokens!r}")
    if not MIN_TOKENS <= tokens <= MAX_TOKENS:
        raise fail(f"tasks[{i}].tokens must be between {MIN_TOKENS} and {MAX_TOKENS}, got {tokens}")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000:
        raise fail(f"tasks[{i}].count must be a whole number from 1 to 1000, got {count!r}")
    return TaskSpec(family=family, tokens=tokens, count=count)


def _federation(fed: Any, fail: Any, base: Path | None) -> tuple[tuple[VenueDef, ...], str, str]:
    if not isinstance(fed, dict):
        raise fail("federation must be an object with local, premium and venues")
    items = fed.get("venues")
    if not isinstance(items, list) or not items:
        raise fail("federation.venues must be a non-empty list of venues")
    venues = tuple(_venue(item, i, fail, base) for i, item in enumerate(items))
    names = [v.name for v in venues]
    if len(set(names)) != len(names):
        raise fail("federation.venues names a venue twice")
    local = fed.get("local", names[0])
    if local not in names:
        raise fail(f"federation.local {local!r} must be one of the venues ({', '.join(names)})")
    premium = fed.get("premium") or ""
    if premium and premium not in names:
        raise fail(f"federation.premium {premium!r} must be one of the venues ({', '.join(names)})")
    if premium and premium == local:
        raise fail("federation.premium must differ from federation.local")
    return venues, local, premium


def _venue(item: Any, i: int, fail: Any, base: Path | None) -> VenueDef:
    where = f"federation.venues[{i}]"
    if not isinstance(item, dict):
        raise fail(f"{where} must be an object with name, workers and profile")
    name = item.get("name")
    if not isinstance(name, str) or not _VENUE.fullmatch(name):
        raise fail(
            f"{where}.name must be a venue name (lowercase letters, digits, - or _), got {name!r}"
        )
    workers = item.get("workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 64:
        raise fail(f"{where}.workers must be a whole number from 1 to 64, got {workers!r}")
    trusted = item.get("trusted", False)
    if not isinstance(trusted, bool):
        raise fail(f"{where}.trusted must be true or false, got {trusted!r}")
    profile = item.get("profile", "edge")
    if isinstance(profile, dict):
        problem = _inline_problem(profile) or _inline_ranges(profile, name)
        if problem:
            raise fail(f"{where}.profile: {problem}")
        return VenueDef(name, workers, "", profile, trusted)
    if not isinstance(profile, str):
        raise fail(f"{where}.profile must be a profile name, a .toml path or a table")
    if profile.endswith(".toml") and base is not None and not Path(profile).is_absolute():
        profile = str(base / profile)
    try:
        profile_load(profile)
    except ProfileFileError as exc:
        raise fail(f"{where}.profile: {exc}") from exc
    return VenueDef(name, workers, str(profile_path(profile)), {}, trusted)


def _inline_problem(profile: dict[str, Any]) -> str:
    """What is wrong with a profile table, or "" (the ranges are profile_load's to check)."""
    sections = {s for s, _, _ in _LAYOUT.values() if s}
    for key, value in profile.items():
        if key in sections:
            if not isinstance(value, dict):
                return f"[{key}] must be a table"
            for sub in value:
                if _LAYOUT.get(sub, (None,))[0] != key:
                    return f"[{key}] has no setting {sub!r}"
        elif key == "description":
            continue
        elif _LAYOUT.get(key, ("?",))[0] is not None:
            return f"unknown setting {key!r} (sections: {', '.join(sorted(sections))})"
    return ""


def _inline_ranges(profile: dict[str, Any], name: str) -> str:
    """What profile_load finds wrong with the table once written as a file, or ""."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.toml"
        path.write_text(profile_toml(profile, name))
        try:
            profile_load(str(path))
        except ProfileFileError as exc:
            return str(exc).removeprefix(f"{path}: ")
    return ""


def profile_toml(profile: dict[str, Any], name: str) -> str:
    """A profile table as the TOML file frlm_swarm reads (values written as JSON scalars,
    which TOML reads the same; profile_load checks their types and ranges)."""
    lines = [f"description = {json.dumps(str(profile.get('description', name)))}"]
    tables = {k: v for k, v in profile.items() if isinstance(v, dict)}
    lines += [
        f"{k} = {json.dumps(v)}"
        for k, v in profile.items()
        if k != "description" and not isinstance(v, dict)
    ]
    for section, table in tables.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
