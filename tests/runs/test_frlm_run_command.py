"""`manage.py frlm_run` as a user types it, against the real stack."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from decimal import Decimal

import pytest

from frlm_web.stack import free_port
from runs.cli import summarise
from runs.models import Run
from tests.helpers import endpoint, forget_reputations, named, trace, wait_until
from workers.pricing import TABLE_DATE

pytestmark = [pytest.mark.stack]


def frlm_run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "frlm_run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_it_answers_a_generated_needle_task_as_json(venues, subprocess_env):
    done = frlm_run(
        subprocess_env,
        "--task",
        "sniah",
        "--tokens",
        "200000",
        "--seed",
        "7",
        "--venues",
        "local,edge",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded"
    assert result["correct"] is True
    assert result["answer"] == result["expected_answer"]
    assert result["subqueries"] >= 10
    assert result["tokens_in"] > 200_000 and Decimal(result["cost_usd"]) > 0
    assert Decimal(result["cost_usd"]) == Run.objects.get(id=result["run_id"]).cost
    assert result["simulated"] is True and result["simulated_roles"] == ["root", "worker"]
    # The simulated models' nominal prices, from FRLM's dated table.
    table = f"FRLM's table of {TABLE_DATE}"
    assert result["prices"] == {"frlm-sim-root": table, "frlm-sim-worker": table}
    assert result["isolation"].startswith("bwrap")
    run = Run.objects.get(id=result["run_id"])
    events = trace(run)
    assert named(events, "Run.Done")[0]["attrs"]["correct"] is True


@pytest.fixture
def notes(context_root):
    """A text file under the context roots, for runs whose context is beside the point."""
    path = context_root / "notes.md"
    path.write_text("The launch window opens on Tuesday at dawn.\n")
    return path


def test_it_prints_a_summary_and_progress(venues, subprocess_env, context_root):
    corpus = context_root / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The launch window opens on Tuesday at dawn.\n" * 50)
    (corpus / "b.md").write_text("Budget notes: the rover costs nine million.\n" * 50)
    done = frlm_run(
        subprocess_env,
        "--question",
        "When does the launch window open?",
        "--context",
        str(corpus),
        "--venues",
        "local",
    )
    assert done.returncode == 0, done.stderr
    assert "Tuesday" in done.stdout
    assert "sub-queries" in done.stderr  # the progress bar
    for label in ("run ", "answer ", "wall ", "tokens ", "trace "):
        assert label in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--question", "", "--context", "NOTES"], "--question: the question is empty"),
        (["--question", "q", "--context", "ROOT/nonexistent/corpus"], "does not exist"),
        (["--question", "q", "--context", "README.md"], "is outside the folders"),
        (
            ["--question", "q", "--context", "NOTES", "--policy", "quorum=3"],
            "policy.quorum must be between 0.05 and 1.0, got 3",
        ),
        (["--question", "q", "--context", "NOTES", "--venues", "mars"], "unknown venue mars"),
        (["--question", "q"], "give a context"),
        (
            ["--question", "x" * 100_001, "--context", "NOTES"],
            "--question: the question is 100,001 characters, more than the 100,000",
        ),
        (["--task", "nope"], "invalid choice"),
        (["--task", "sniah", "--tokens", "5"], "tokens"),
        # Taken and ignored before (found by a review).
        (["--question", "q", "--context", "NOTES", "--tokens", "5000"], "drop them"),
        (["--question", "q", "--context", "NOTES", "--seed", "3"], "drop them"),
        (
            ["--question", "q", "--context", "NOTES", "--root-model", "gpt"],
            "unknown root model",
        ),
        # Both were taken (a review): the simulated root was sent to the endpoint, and the
        # run failed with advice to start the simulated server; a URL of nothing failed so.
        (
            ["--question", "q", "--context", "NOTES", "--base-url", "http://127.0.0.1:1/v1"],
            "give them with --root-model openai[:MODEL] and/or --worker-model",
        ),
        (
            ["--question", "q", "--context", "NOTES", "--root-model", "openai:m"]
            + ["--base-url", "notaurl"],
            "--base-url 'notaurl' is not an http:// or https:// URL",
        ),
    ],
)
def test_it_rejects_bad_input_with_a_clear_message(
    venues, subprocess_env, notes, context_root, args, message
):
    before = Run.objects.count()
    args = [a.replace("NOTES", str(notes)).replace("ROOT", str(context_root)) for a in args]
    done = frlm_run(subprocess_env, *args, timeout=60)
    assert done.returncode != 0
    assert message in done.stderr
    assert Run.objects.count() == before  # nothing half-made


def test_it_rejects_a_binary_context(venues, subprocess_env, context_root):
    blob = context_root / "model.bin"
    blob.write_bytes(b"\x00\x01\x02" * 100)
    done = frlm_run(subprocess_env, "--question", "q", "--context", str(blob), timeout=60)
    assert done.returncode != 0
    assert "is binary, not text" in done.stderr


def test_it_fails_the_run_when_the_model_endpoint_is_down(venues, subprocess_env, notes):
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = frlm_run(
        subprocess_env,
        "--question",
        "q",
        "--context",
        str(notes),
        "--root-model",
        "openai:some-model",
        "--base-url",
        url,
        "--json",
    )
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["status"] == "failed"
    assert f"cannot reach the model endpoint {url}" in result["error"]
    # Said on the run page too, where there is no --base-url: both ways named.
    assert "frlm_run's --base-url, FRLM_ENDPOINTS for the launcher" in result["error"]
    events = trace(Run.objects.get(id=result["run_id"]))
    assert named(events, "Run.Decode", "end")[0]["status"] == "error"


def test_it_fails_the_run_when_the_endpoint_answers_garbage(venues, subprocess_env, notes):
    with endpoint(lambda _: (200, b"<html>this is not an API</html>")) as (url, _):
        done = frlm_run(
            subprocess_env,
            "--question",
            "q",
            "--context",
            str(notes),
            "--root-model",
            "openai:m",
            "--base-url",
            url,
            "--json",
        )
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["status"] == "failed"
    assert "the root model failed" in result["error"]


def test_it_prints_what_verification_and_receipts_cost_and_a_budget_stop(venues, subprocess_env):
    forget_reputations()
    args = ("--task", "sniah", "--tokens", "200000", "--seed", "3", "--venues", "local,edge")
    done = frlm_run(subprocess_env, *args, "--policy", "tier=redundant")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "match: yes" in out
    assert f"prices     frlm-sim-root: FRLM's table of {TABLE_DATE}" in out
    assert re.search(r"cost \$\d+\.\d{4}  \(simulated model: nominal prices\)", out)
    assert "verify     " in out and "replica" in out and "% of all" in out
    assert "receipts   " in out and "(replies " in out and "accepted" in out
    run_id = out.split()[1]  # "run        <id>  (succeeded)"
    assert f"not checked here: manage.py frlm_receipts verify {run_id}" in out

    stopped = frlm_run(subprocess_env, *args, "--policy", "budget_usd=0.004", "--json")
    assert stopped.returncode == 1  # not succeeded
    result = json.loads(stopped.stdout)
    assert result["status"] == "partial"
    assert result["error"].startswith("budget cap reached")
    figures = result["accounts"]["budget"]["run"]
    assert figures["cap"] == "0.004"
    assert Decimal(figures["settled"]) <= Decimal("0.004")
    # Money is printed as exact decimal strings: no float leftovers such as 5.2e-18.
    assert all(
        isinstance(figures[k], str) and "e" not in figures[k].lower()
        for k in figures
        if k in ("reserved", "settled", "committed", "cap")
    )


def test_its_help_shows_no_empty_choice_and_says_its_defaults():
    """`--program {,map_reduce,...}` showed the empty default as a choice, and --timeout
    said no default (a review)."""
    from runs.management.commands.frlm_run import Command

    text = " ".join(Command().create_parser("manage.py", "frlm_run").format_help().split())
    assert "{," not in text and "--program {map_reduce," in text
    assert "seconds to wait for the answer (default 3600)" in text


def test_the_launcher_asks_for_the_task_frlm_run_makes_by_default():
    """The launcher's seed was 1 and frlm_run's 0: the same generated task asked for on
    the page and on the command line, with no seed given, was two different tasks."""
    from runs.forms import RunForm
    from runs.management.commands.frlm_run import Command

    text = " ".join(Command().create_parser("manage.py", "frlm_run").format_help().split())
    form = RunForm.base_fields
    assert f"seed of the generated task (default {form['task_seed'].initial})" in text
    assert f"in tokens (default {form['task_tokens'].initial})" in text
    assert form["task_seed"].initial == 0


def test_no_wait_with_json_prints_the_queued_run_as_json(venues, subprocess_env):
    """--no-wait --json printed a bare run id, which a script's json.loads refused (a
    review): the queued run's summary now, for frlm_run and frlm_replay alike."""
    started = frlm_run(subprocess_env, "--task", "sniah", "--tokens", "2000", "--no-wait", "--json")
    assert started.returncode == 0, started.stderr
    queued = json.loads(started.stdout)
    assert queued["status"] == "queued" and queued["answer"] == ""
    run = wait_until(
        lambda: (r := Run.objects.get(id=queued["run_id"])).done and r, timeout=60, what="the run"
    )
    assert run.status == "succeeded", run.error
    replay = subprocess.run(
        [sys.executable, "manage.py", "frlm_replay", run.id, "--no-wait", "--json"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    replayed = json.loads(replay.stdout)
    assert replayed["replay_of"] == run.id and replayed["status"] == "queued"
    wait_until(lambda: Run.objects.get(id=replayed["run_id"]).done, timeout=60, what="the replay")


def test_a_folder_run_says_which_files_it_leaves_out(venues, subprocess_env, context_root):
    folder = context_root / "mixed"
    folder.mkdir()
    (folder / "notes.txt").write_text("The launch window opens on Tuesday at dawn.\n")
    (folder / "logo.svg").write_text("<svg/>")
    done = frlm_run(
        subprocess_env,
        "--question", "When does the launch window open?",
        "--context", str(folder),
        "--venues", "local",
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the note is not in --json's output
    assert (
        f"note: context folder {folder.resolve()}: 1 file(s) joined; 1 left out: logo.svg "
        "(not a text file's name (.svg))"
    ) in done.stderr
    (loaded,) = [e for e in named(trace(Run.objects.get(id=result["run_id"])), "Env.LoadFragment")
                 if "left_out" in e["attrs"]]  # fmt: skip
    attrs = loaded["attrs"]
    assert (attrs["files"], attrs["left_out_count"]) == (1, 1)
    assert attrs["left_out"] == ["logo.svg: not a text file's name (.svg)"]


def test_the_prices_said_are_the_conductors_not_the_readers(venues, monkeypatch):
    """frlm_run printed where prices come from as its own environment says: with
    FRLM_PRICES set only in the shell that ran it, "FRLM_PRICES", while the conductor had
    priced at FRLM's table (a review). The conductor records its sources on the row."""
    from tests.helpers import finish, launch
    from workers import pricing

    run = finish(launch(task="sniah", tokens=2_000, seed=1))
    table = f"FRLM's table of {TABLE_DATE}"
    assert run.accounts["prices"] == {"frlm-sim-root": table, "frlm-sim-worker": table}
    monkeypatch.setenv("FRLM_PRICES", '{"frlm-sim-root": ["1", "2"]}')
    pricing.overrides.cache_clear()
    try:
        assert pricing.price_source("frlm-sim-root") == "FRLM_PRICES"  # the reader's own
        assert Run.objects.get(id=run.id).price_sources["frlm-sim-root"] == table
        assert summarise(Run.objects.get(id=run.id))["prices"]["frlm-sim-root"] == table
    finally:
        monkeypatch.delenv("FRLM_PRICES")
        pricing.overrides.cache_clear()
