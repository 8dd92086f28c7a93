"""What every `frlm_*` management command shares: a parser whose errors are one line and
exit 2, argument types that check ranges as they parse, and `--json` output.

A command subclasses `FrlmCommand` instead of Django's BaseCommand; its arguments use the
types below (`whole(1)`, `number(0)`, `rate`, `port`) so `--limit -1` is refused before
`handle` runs, with a line that names the flag, the value and what it takes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

from frlm_web.money import money_str


class OneLineParser(CommandParser):
    """Django's parser, whose errors on the command line are one line (no usage block) that
    points at --help, with exit status 2; called from code, it raises CommandError."""

    argv: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        message += _dash_hint(message, self.argv, set(self._option_string_actions))
        if self.called_from_command_line:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        raise CommandError(f"Error: {message}")


class FrlmCommand(BaseCommand):
    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        _one_line(parser)
        return parser

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except BrokenPipeError:
            # The reader closed the pipe (`| head`): it has what it wanted. Nothing more is
            # said, not even by the interpreter's last flush, and the command ends as a tool
            # killed by SIGPIPE does, so a shell's pipefail still tells the two apart.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(128 + signal.SIGPIPE)

    def print_json(self, data: Any) -> None:
        """`data` as one JSON document on stdout (money as decimal strings, frlm_web.money)."""
        self.stdout.write(json.dumps(data, indent=2, default=_json_default))


def _dash_hint(message: str, argv: list[str], options: set[str]) -> str:
    """argparse reads a value that starts with '-' and is not a plain number (`-1d`) as an
    option, and says only that the flag "expected one argument": say how to give it."""
    head, _, rest = message.partition(": ")
    if rest != "expected one argument" or not head.startswith("argument "):
        return ""
    names = head.removeprefix("argument ").split("/")
    for flag, value in zip(argv, argv[1:], strict=False):
        # A value forgotten before the next option ("--limit --json") is not one.
        known = value in options or value.split("=", 1)[0] in options
        if flag in names and value.startswith("-") and value != "-" and not known:
            return f"; {value!r} is read as an option: write {flag}={value} to give it as a value"
    return ""


def _one_line(parser: CommandParser) -> None:
    """Django builds its own CommandParser (and the subcommands' parsers, in add_arguments);
    OneLineParser changes only how their errors are shown."""
    parser.__class__ = OneLineParser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _one_line(sub)


def _json_default(value: Any) -> Any:
    # Money as its exact decimal spelling, dates as ISO 8601: never a float.
    if isinstance(value, Decimal):
        return money_str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


# The largest whole number a command takes even with no `high`: a database integer's
# (`frlm_runs --limit 99999999999999999999` ended in a traceback from SQLite, a review).
WHOLE_MAX = 2**63 - 1


def whole(low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` (to `high`, or WHOLE_MAX)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or value > (WHOLE_MAX if high is None else high):
            span = f"from {low} to {high}" if high is not None else f"{low} or more"
            if high is None and value is not None and value > WHOLE_MAX:
                span += f" (at most {WHOLE_MAX})"
            raise argparse.ArgumentTypeError(f"takes a whole number {span}, not {text!r}")
        return value

    parse.__name__ = "whole number"
    return parse


def is_http_url(text: str) -> bool:
    """Whether `text` is an http:// or https:// URL with a host."""
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def http_url(text: str) -> str:
    """An argparse type: an http:// or https:// URL with a host (a web server's address)."""
    if not is_http_url(text):
        raise argparse.ArgumentTypeError(
            f"takes an http:// or https:// URL, e.g. http://10.0.0.5:8000, not {text[:200]!r}"
        )
    return text


http_url.__name__ = "URL"


def assignment(text: str) -> str:
    """An argparse type: KEY=VALUE (a policy setting); the value may be empty, the key not.
    The form is argparse's to refuse (exit 2); whether the key and value mean anything, the
    command's (exit 1)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, e.g. quorum=0.9, not {text!r}")
    return text


assignment.__name__ = "KEY=VALUE"


def number(low: float = 0.0, high: float | None = None, *, above: bool = False):
    """An argparse type: a finite number from `low` (more than `low` when `above`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        ok = value is not None and value == value and value not in (float("inf"), float("-inf"))
        if ok:
            ok = (value > low if above else value >= low) and (high is None or value <= high)
        if not ok:
            span = f"more than {low:g}" if above else f"{low:g} or more"
            if high is not None:
                span += f" and at most {high:g}"
            raise argparse.ArgumentTypeError(f"takes a number {span}, not {text!r}")
        return value  # type: ignore[return-value]

    parse.__name__ = "number"
    return parse


rate = number(0.0, 1.0)  # a share: 0 to 1
port = whole(0, 65535)  # 0 picks a free port
