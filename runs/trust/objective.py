"""Objective checks of a reply, the call's own `validate=`: a JSON schema, a regular
expression, or a function the program runs (its outcome turned into a verdict here). The
judge (runs/engine/fanout/judging.py) sends a reply that fails to another worker."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import jsonschema
from jsonschema.exceptions import SchemaError

from frlm_web import jsontext

CheckKind = Literal["schema", "regex", "function"]


class CheckAttrs(TypedDict):
    """What a Verify.Objective event carries."""

    tier: str
    check: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class CheckVerdict:
    """The outcome of one objective check of one reply; `reason` says why it failed."""

    ok: bool
    check: CheckKind
    reason: str = ""

    def attrs(self) -> CheckAttrs:
        return {"tier": "objective", "check": self.check, "ok": self.ok, "reason": self.reason}


class SchemaCheck:
    """A reply must be JSON that validates against `schema`. The schema is checked once,
    when the check is made, so a bad schema is the program's error, not the worker's."""

    def __init__(self, schema: dict[str, Any]) -> None:
        if not isinstance(schema, dict):
            raise ValueError("validate: a JSON schema must be a JSON object (a dict)")
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except SchemaError as exc:
            raise ValueError(f"validate: not a valid JSON schema: {exc.message}") from exc
        self.schema = schema
        self._validator = cls(schema)

    def __call__(self, text: str) -> CheckVerdict:
        try:
            value = jsontext.loads(text)
        except (ValueError, TypeError) as exc:
            return CheckVerdict(False, "schema", f"not JSON: {exc}")
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is None:
            return CheckVerdict(True, "schema")
        where = "/".join(str(p) for p in error.absolute_path)
        return CheckVerdict(False, "schema", f"at /{where}: {error.message}")


class RegexCheck:
    """The whole reply (surrounding whitespace dropped) must match `pattern`: a pattern
    that should match anywhere says so with .* around it."""

    def __init__(self, pattern: str) -> None:
        try:
            self._regex = re.compile(pattern, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"validate: not a valid regular expression: {exc}") from exc
        self.pattern = pattern

    def __call__(self, text: str) -> CheckVerdict:
        if self._regex.fullmatch(text.strip()):
            return CheckVerdict(True, "regex")
        return CheckVerdict(False, "regex", f"does not match {self.pattern!r}")


def objective_check(validate: dict[str, Any] | str) -> SchemaCheck | RegexCheck:
    """The check for a `validate=` value: a dict is a JSON schema, a string a regex. (A
    function is run by the caller in the sandbox; give its outcome to function_verdict.)"""
    if isinstance(validate, dict):
        return SchemaCheck(validate)
    if isinstance(validate, str):
        return RegexCheck(validate)
    raise ValueError(
        "validate= takes a JSON schema (a dict), a regular expression (a str) or a function; "
        f"got {type(validate).__name__}"
    )


def function_verdict(result: object, error: str | None = None) -> CheckVerdict:
    """The verdict of a check function the caller ran on a reply: `result` is what it
    returned, `error` the exception text when it raised. Truthy passes; a raise fails."""
    if error:
        return CheckVerdict(False, "function", f"the check raised {error}")
    if result:
        return CheckVerdict(True, "function")
    return CheckVerdict(False, "function", f"the check returned {result!r}")
