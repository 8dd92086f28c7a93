"""The Procfile at the top of the repository: every process it names is a command that
exists, with flags it takes, as the README tells deployers to run it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from daphne.cli import CommandLineInterface
from django.conf import settings
from django.core.management import get_commands, load_command_class

from frlm_web.redis_acl import ROLES
from frlm_web.stack import WS_HANDSHAKE_S
from workers.gateway.protocol import MAX_MESSAGE_BYTES

PROCFILE = Path(settings.BASE_DIR) / "Procfile"
# What honcho and foreman take as a process line: `name: command`.
LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")


def processes() -> dict[str, str]:
    found = {}
    for line in PROCFILE.read_text().splitlines():
        match = LINE.match(line)
        if match:
            assert match.group(1) not in found, f"process {match.group(1)} named twice"
            found[match.group(1)] = match.group(2)
    return found


def argv_of(command: str) -> tuple[dict[str, str], list[str]]:
    """The variables a line sets with `env` and the argv it runs, its ${VAR:-default}
    expansions taken at their defaults (as the shell does with the variable unset)."""
    expanded = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", command)
    assert "$" not in expanded, f"an expansion without a default: {command}"
    words = shlex.split(expanded)
    env: dict[str, str] = {}
    if words[0] == "env":
        words = words[1:]
        while "=" in words[0]:
            key, _, value = words.pop(0).partition("=")
            env[key] = value
    return env, words


def test_it_describes_every_process_of_a_deployment():
    assert set(processes()) == {
        "web",
        "conductor",
        "recorder",
        "forwarder",
        "worker",
        "simserver",
    }


@pytest.mark.parametrize("name", sorted(processes()))
def test_each_process_logs_in_to_redis_as_its_own_role(name):
    env, _argv = argv_of(processes()[name])
    assert env.get("FRLM_REDIS_ROLE") in ROLES
    assert env["FRLM_REDIS_ROLE"] == name, "the role is named after the process"


@pytest.mark.parametrize("name", sorted(set(processes()) - {"web"}))
def test_each_management_command_exists_and_takes_its_flags(name):
    _env, argv = argv_of(processes()[name])
    assert argv[:2] == ["python", "manage.py"], argv
    command = argv[2]
    assert command in get_commands(), f"no management command {command}"
    parser = load_command_class(get_commands()[command], command).create_parser(
        "manage.py", command
    )
    parser.parse_args(argv[3:])  # CommandError (not from the command line) when a flag is wrong


def test_the_web_process_is_daphne_as_the_stack_starts_it():
    _env, argv = argv_of(processes()["web"])
    assert argv[:3] == ["python", "-m", "frlm_web.web_server"], argv
    args = CommandLineInterface().parser.parse_args(argv[3:])
    assert args.application == "frlm_web.asgi:application"
    # A gateway job with its fragments fits in one WebSocket message (frlm_web/stack.py).
    assert args.websocket_max_message_size == MAX_MESSAGE_BYTES
    assert args.websocket_max_frame_size == MAX_MESSAGE_BYTES
    # A handshake slowed by a loaded machine is not refused as 1006 (frlm_web/stack.py).
    assert args.websocket_connect_timeout == WS_HANDSHAKE_S
    assert args.proxy_headers and args.host == "127.0.0.1" and args.port == 8000


def test_the_parse_check_refuses_a_flag_a_command_does_not_take():
    # The check above could pass on anything if parse_args never refused: it does.
    from django.core.management import CommandError

    parser = load_command_class(get_commands()["frlm_recorder"], "frlm_recorder").create_parser(
        "manage.py", "frlm_recorder"
    )
    with pytest.raises(CommandError, match="unrecognized arguments: --no-such-flag"):
        parser.parse_args(["--no-such-flag"])
