"""Commands that run without Django's app registry.

`django.setup()` imports every installed app, Django's admin and auth among them, and is
most of what a command pays before its work (issue 18: 0.4-0.6 s of CPU of the 0.55 s that
`frlm_diff --help` took). A command that reads only the trace store (files under the data
directory, through traces.store and traces.blobs) needs the settings and nothing else, so
manage.py runs it here: settings loaded, no apps populated, no database opened.

A command listed here must not touch a model: the app registry is not ready, and a model
import raises AppRegistryNotReady. `tests/frlm_web/test_command_startup.py` runs each one
and checks that it neither populates the registry nor imports a model module.
"""

from __future__ import annotations

import importlib

# name -> module; each reads the trace store only.
LIGHT_COMMANDS = {
    "frlm_diff": "traces.management.commands.frlm_diff",
    "frlm_trace": "traces.management.commands.frlm_trace",
}


def run_light(argv: list[str]) -> bool:
    """Run argv's command if it is a light one (True), else leave it to Django (False).
    `--settings` and `--pythonpath` take Django's path, which applies them before setup."""
    if len(argv) < 2 or argv[1] not in LIGHT_COMMANDS:
        return False
    if any(arg.startswith(("--settings", "--pythonpath")) for arg in argv[2:]):
        return False
    command = importlib.import_module(LIGHT_COMMANDS[argv[1]]).Command()
    command.run_from_argv(argv)
    return True
