"""Every `frlm_*` management command: help on every option, arguments checked as they are
parsed (one line, exit 2), and `--json` where a command prints data."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command, get_commands, load_command_class

from runs.models import Run
from runs.services import ContextSpec, RunInputError, run_create
from tests.helpers import local_venue
from workers.backends import model_spec

FRLM_COMMANDS = sorted(name for name in get_commands() if name.startswith("frlm_"))


def parser_of(name: str) -> argparse.ArgumentParser:
    command = load_command_class(get_commands()[name], name)
    return command.create_parser("manage.py", name)


def actions_of(parser: argparse.ArgumentParser, where: str):
    """(where, action) for every argument of a parser and of its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from actions_of(subparser, f"{where} {sub}")
        elif not isinstance(action, argparse._HelpAction):
            yield where, action


def test_it_finds_the_commands_it_walks():
    # A walk over nothing would pass: these are the processes and tools the docs name.
    assert {"frlm_run", "frlm_runs", "frlm_worker", "frlm_recorder", "frlm_receipts"} <= set(
        FRLM_COMMANDS
    )
    assert len(FRLM_COMMANDS) >= 18


@pytest.mark.parametrize("name", FRLM_COMMANDS)
def test_it_gives_every_option_help_text(name):
    missing = [
        f"{where}: {'/'.join(action.option_strings) or action.dest}"
        for where, action in actions_of(parser_of(name), name)
        if action.help != argparse.SUPPRESS and not (action.help or "").strip()
    ]
    assert missing == [], f"options without help: {missing}"


def manage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "frlm_web.settings"},
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["frlm_runs", "--limit", "-1"], "argument --limit: takes a whole number 1 or more"),
        (["frlm_runs", "--limit", "many"], "argument --limit: takes a whole number 1 or more"),
        (
            ["frlm_run", "--task", "sniah", "--tokens", "0"],
            "argument --tokens: takes a whole number from 100 to 50000000, not '0'",
        ),
        (["frlm_simserver", "--lie-rate", "2"], "argument --lie-rate: takes a number 0 or more"),
        (["frlm_recorder", "--nice", "40"], "argument --nice: takes a whole number from 0 to 19"),
        (["frlm_token", "--venue", "x", "--ttl-hours", "0"], "argument --ttl-hours: takes a"),
        (["frlm_up", "--web-port", "70000"], "argument --web-port: takes a whole number"),
        (["frlm_receipts", "verify"], "the following arguments are required: run_id"),
        # The form of a setting is the option's own (exit 1 before, a review).
        (["frlm_run", "--task", "sniah", "--policy", "quorum"], "argument --policy: takes KEY="),
        (["frlm_replay", "rabc", "--set", "=3"], "argument --set: takes KEY=VALUE"),
        (
            ["frlm_experiment", "--output", "/tmp/x", "--tune", "hedge"],
            "argument --tune: takes KEY=VALUE",
        ),
        # Ranges and forms that were checked in code, with exit 1 (a review).
        (
            ["frlm_worker", "--venue", "local", "--concurrency", "100000"],
            "argument --concurrency: takes a whole number from 1 to 1024",
        ),
        (["frlm_swarm", "--workers", "300"], "argument --workers: takes a whole number from 1"),
        (["frlm_prune", "--older-than", "30x"], "argument --older-than: takes an age like 30d"),
        (["frlm_prune", "--older-than", "36501d"], "argument --older-than: takes an age of at"),
        # A value that starts with '-' is an option to argparse: say how to give it (before,
        # only "expected one argument").
        (["frlm_runs", "--limit", "9" * 20], f"1 or more (at most {2**63 - 1}), not '999"),
        (["frlm_runs", "--limit", "--json"], "--limit: expected one argument (see --help)"),
        (["frlm_prune", "--older-than", "-1d"], "'-1d' is read as an option: write --older-than="),
        (["frlm_prune", "--older-than=-1d"], "argument --older-than: takes an age like 30d"),
        (
            ["frlm_worker", "--venue", "local", "--server", "ftp://x"],
            "argument --server: takes an http:// or https:// URL",
        ),
        (["frlm_worker", "--venue", "Local"], "argument --venue: takes a venue name"),
        (["frlm_worker", "--venue", "a", "--name", "a/b"], "argument --name: takes 1 to 64"),
        (["frlm_swarm", "--venue", "a b"], "argument --venue: takes a venue name"),
        (["frlm_token", "--venue", "a", "--label", "x" * 101], "argument --label: takes at most"),
    ],
)
def test_it_refuses_bad_arguments_in_one_line_with_exit_2(args, says):
    done = manage(*args)
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # no usage block, no traceback
    assert says in lines[0] and lines[0].endswith("(see --help)")
    assert lines[0].startswith(f"manage.py {args[0]}")


def test_it_raises_a_command_error_for_bad_arguments_in_code():
    with pytest.raises(CommandError, match="argument --limit: takes a whole number 1 or more"):
        call_command("frlm_runs", "--limit", "0")


@pytest.mark.django_db
def test_it_says_where_to_look_for_an_unknown_run_in_frlm_diff():
    with pytest.raises(CommandError) as failed:
        call_command("frlm_diff", "rNoSuchA", "rNoSuchB")
    assert "frlm_runs" in str(failed.value) and "\n" not in str(failed.value)


@pytest.mark.django_db
def test_it_does_not_call_the_question_empty_when_the_task_failed(settings):
    settings.FRLM_SANDBOX_ISOLATION = "none"
    local_venue()
    with pytest.raises(RunInputError) as refused:
        run_create(
            question="",
            context=ContextSpec(task="sniah", tokens=10, seed=0),
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )
    assert set(refused.value.errors) == {"task"}, refused.value.errors
    assert "tokens must be between 100" in refused.value.errors["task"]


@pytest.mark.django_db
def test_a_task_asked_another_question_has_no_expected_answer(settings):
    """A run over a task's context asking the user's own question was scored against the
    task's answer, to a question it was never asked (found by a review)."""
    settings.FRLM_SANDBOX_ISOLATION = "none"
    local_venue()

    def made(question: str):
        return run_create(
            question=question,
            context=ContextSpec(task="sniah", tokens=1000, seed=0),
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )

    own = made("hi")
    assert own.question == "hi" and own.expected_answer == "" and own.task["name"] == "sniah"
    task = made("")
    assert task.expected_answer and made(task.question).expected_answer == task.expected_answer


def test_a_command_piped_into_head_stops_quietly(stack, transactional_db, subprocess_env):
    """`frlm_trace RUN --events | head -1` ended in a BrokenPipeError traceback (found by a
    review): a reader that has read enough is no error to report."""
    from tests.helpers import bare_run
    from traces.emitter import Emitter
    from traces.recorder import _write_segment

    run = bare_run(question="q")
    emitter = Emitter(None, run.id)  # type: ignore[arg-type]
    events = [emitter.build("Run.Init", "start", span_id="a" * 16)]
    for seq in range(2, 3001):
        events.append(emitter.build("Budget.Alert", "instant", parent="a" * 16, attrs={"n": seq}))
    for seq, event in enumerate(events, 1):
        event["seq"] = seq
    _write_segment(run.id, events, first_id="1-0")
    reader = subprocess.Popen(
        [sys.executable, "manage.py", "frlm_trace", run.id, "--events"],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert json.loads(reader.stdout.readline())["name"] == "Run.Init"
    reader.stdout.close()  # as head does once it has its line
    _out, err = reader.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()[-800:]
    assert reader.returncode == 141  # as a tool killed by SIGPIPE, for a shell's pipefail


def test_frlm_trace_prints_the_span_tree_as_json(stack, transactional_db):
    """The README says the commands that print data take --json; frlm_trace took only
    --events (a review). Its tree as JSON: nested children, instants, cost exact."""
    from tests.helpers import bare_run
    from traces.emitter import Emitter
    from traces.recorder import _write_segment

    run = bare_run(question="q")
    emitter = Emitter(None, run.id)  # type: ignore[arg-type]
    root, child = "a" * 16, "b" * 16
    events = [
        emitter.build("Run.Init", "start", span_id=root),
        emitter.build("SubQuery.Submit", "start", span_id=child, parent=root, depth=1),
        emitter.build("Budget.Alert", "instant", parent=child, attrs={"spent": "<b>0.8</b>"}),
        emitter.build("SubQuery.Submit", "end", span_id=child, parent=root, depth=1, cost=0.1),
        emitter.build("Run.Init", "end", span_id=root, cost=0.30000000000000004),
    ]
    for seq, event in enumerate(events, 1):
        event["seq"] = seq
    _write_segment(run.id, events, first_id="1-0")
    tree = json.loads(out_of("frlm_trace", run.id, "--json"))
    assert tree["run_id"] == run.id and [s["name"] for s in tree["spans"]] == ["Run.Init"]
    top = tree["spans"][0]
    assert top["cost"] == "0.30000000000000004" and top["end_ns"] > top["start_ns"]
    (sub,) = top["children"]
    assert sub["name"] == "SubQuery.Submit" and sub["cost"] == "0.1" and sub["children"] == []
    assert sub["instants"][0]["attrs"]["spent"] == "<b>0.8</b>"
    with pytest.raises(CommandError, match="not allowed with argument"):
        out_of("frlm_trace", run.id, "--json", "--events")


def test_frlm_status_says_a_stack_that_is_not_up_as_json(tmp_path, settings):
    settings.DATA_DIR = tmp_path
    assert json.loads(out_of("frlm_status", "--json")) == {
        "up": False,
        "supervisor_pid": None,
        "processes": [],
    }


def out_of(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_it_lists_runs_as_json_with_exact_costs():
    for n, cost in enumerate(("0.000123", "1.5")):
        Run.objects.create(
            id=f"rJs{n}",
            question=f"q{n}",
            context_source=Run.Source.TEXT,
            root_model={},
            worker_model={},
            status=Run.Status.SUCCEEDED,
            cost=Decimal(cost),
            wall_ms=1500,
        )
    rows = json.loads(out_of("frlm_runs", "--json", "--limit", "5"))
    assert [r["run_id"] for r in rows] == ["rJs1", "rJs0"]  # newest first
    assert [r["cost_usd"] for r in rows] == ["1.5", "0.000123"]
    assert rows[0]["status"] == "succeeded" and rows[0]["wall_s"] == 1.5
    assert len(json.loads(out_of("frlm_runs", "--json", "--limit", "1"))) == 1


@pytest.mark.django_db
def test_it_prints_a_new_token_as_json():
    data = json.loads(out_of("frlm_token", "--venue", "jsonvenue", "--label", "ci", "--json"))
    assert data["venue"] == "jsonvenue" and data["venue_created"] is True
    assert data["label"] == "ci" and data["expires"] is None
    assert len(data["token"]) > 20
    later = json.loads(out_of("frlm_token", "--venue", "jsonvenue", "--ttl-hours", "2", "--json"))
    assert later["venue_created"] is False and later["expires"].endswith("+00:00")
    assert later["token"] != data["token"]


@pytest.mark.django_db
def test_a_venue_a_token_creates_is_untrusted_unless_asked():
    """A token lets other machines' workers join: a new name (a typo, `rack4`) made a trusted
    local venue, whose workers would consume the broker and go unchecked (a review)."""
    from workers.models import Venue

    made = json.loads(out_of("frlm_token", "--venue", "rack4", "--json"))
    assert made["venue_created"] and made["venue_trusted"] is False
    assert made["venue_kind"] == "edge"
    assert Venue.objects.get(name="rack4").trusted is False
    lab = json.loads(out_of("frlm_token", "--venue", "lab2", "--kind", "local", "--json"))
    assert lab["venue_kind"] == "local" and lab["venue_trusted"] is False
    pod = json.loads(out_of("frlm_token", "--venue", "pod1", "--trusted", "--json"))
    assert pod["venue_trusted"] is True and Venue.objects.get(name="pod1").trusted
    with pytest.raises(CommandError, match="exists and is not trusted.*trust it in the admin"):
        call_command("frlm_token", "--venue", "rack4", "--trusted", stdout=io.StringIO())
    assert Venue.objects.get(name="rack4").trusted is False


@pytest.mark.django_db
def test_it_prints_what_prune_would_remove_as_json():
    data = json.loads(out_of("frlm_prune", "--older-than", "30d", "--dry-run", "--json"))
    assert data["dry_run"] is True
    assert set(data) == {"dry_run", "cutoff", "runs", "blobs", "bytes", "contexts", "context_bytes"}
    assert isinstance(data["runs"], list) and isinstance(data["bytes"], int)


def test_it_prints_the_conductor_key_as_json(settings, tmp_path):
    settings.FRLM_CONDUCTOR_KEY_FILE = tmp_path / "conductor.key"
    with pytest.raises(CommandError, match="no conductor key file here"):
        out_of("frlm_receipts", "key", "--json")
    from runs.trust.receipts import conductor_key

    conductor_key()  # the conductor makes it when it first countersigns
    data = json.loads(out_of("frlm_receipts", "key", "--json"))
    assert data["conductor_key"] == out_of("frlm_receipts", "key").strip()
    assert data["key_file"] == str(tmp_path / "conductor.key")


def test_it_writes_the_redis_acl_file_for_a_supervised_redis(tmp_path):
    from frlm_web.redis_acl import ROLES, acl_lines

    path = tmp_path / "redis" / "frlm.acl"
    data = json.loads(out_of("frlm_redis_acl", "--output", str(path), "--json"))
    assert data == {"path": str(path), "roles": list(ROLES)}
    assert path.stat().st_mode & 0o077 == 0  # the password hashes are ours alone
    assert path.read_text().splitlines() == acl_lines(settings.SECRET_KEY)


@pytest.mark.django_db
def test_make_up_says_how_to_sign_in_and_the_demo_user_can_use_the_admin(monkeypatch, client):
    """`make up` printed "sign in as demo" and no password, and the demo user, staff with no
    permissions, found the admin empty and its venue page forbidden (a review)."""
    from django.contrib.auth import get_user_model

    from frlm_web.management.commands.frlm_up import Command

    monkeypatch.delenv("FRLM_DEMO_PASSWORD", raising=False)
    up = Command(stdout=io.StringIO())
    up.sign_in()  # no demo user yet: made, and its password said
    said = up.stdout._out.getvalue()
    password = said.split("demo user: demo / ")[1].split()[0]
    assert client.login(username="demo", password=password)
    assert client.get("/admin/workers/venue/").status_code == 200
    assert "Venues" in client.get("/admin/").content.decode()

    again = Command(stdout=io.StringIO())
    again.sign_in()  # it exists: its password is left alone, and where it came from said
    assert "the password `make demo` printed" in again.stdout._out.getvalue()
    assert get_user_model().objects.get(username="demo").check_password(password)

    monkeypatch.setenv("FRLM_DEMO_PASSWORD", "chosen-password-1")
    Command(stdout=io.StringIO()).sign_in()
    assert get_user_model().objects.get(username="demo").check_password("chosen-password-1")


@pytest.mark.parametrize("where", ["a folder", "through a file", "no such folder"])
def test_a_worker_key_file_it_cannot_use_is_refused_in_one_line(tmp_path, where):
    """A --key-file that is a folder, or lies under a file or a folder that cannot be made,
    ended frlm_worker in an OSError traceback (a review)."""
    (tmp_path / "file").write_text("x")
    path = {
        "a folder": tmp_path,
        "through a file": tmp_path / "file" / "w.key",
        "no such folder": "/proc/no-such/w.key",
    }[where]
    done = manage("frlm_worker", "--venue", "local", "--name", "kf-1", "--key-file", str(path))
    assert done.returncode == 1, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # no traceback
    assert f"CommandError: the key file {path} cannot be read or made (" in lines[0]
    assert "give --key-file a file in a folder this user can write" in lines[0]


def test_the_summary_says_which_models_cost_is_nominal():
    """A run with a real root model and simulated workers said "simulated model: nominal
    prices" of its whole cost (a review)."""
    from runs.cli import _simulated_note

    assert _simulated_note(["root", "worker"]) == "  (simulated model: nominal prices)"
    assert _simulated_note(["worker"]) == "  (its simulated worker model's part at nominal prices)"
    assert _simulated_note([]) == ""
