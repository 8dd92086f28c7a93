"""A run exported and imported again (frlm_export, frlm_import) is the same run to its
reader: the totals it recorded, a hedge's loser not turned into a failure, and none of its
workers' calls counted again in the live workers' figures (each found by a review)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from runs.importing import run_fields
from runs.models import Run
from runs.selectors import recent_run_ids
from tests.traces.test_interchange import hedged_run_events
from traces.otlp import to_otlp
from traces.otlp_import import from_otlp


def test_a_hedges_loser_comes_back_as_the_worker_ended_it() -> None:
    """The export marks the loser's span an error for other tools (its frlm.status is
    kept); imported back, it was an error of the worker's."""
    doc = to_otlp("hedged", hedged_run_events(), payload_text=None)
    spans = {span.key: span for span in from_otlp(doc).spans}
    assert spans["c" * 16].status == "ok"  # the loser
    assert spans["d" * 16].status == "ok"  # the winner


def test_an_imported_runs_totals_are_the_ones_it_recorded() -> None:
    """Run.Done carries what the run spent in its own fields; counted from the spans
    instead, the loser's call was added (the imported run cost more than the original)."""
    events = hedged_run_events()
    done = {
        **events[-2],
        "seq": 10,
        "span_id": None,
        "parent_id": "a" * 16,
        "name": "Run.Done",
        "phase": "instant",
        "tokens_in": 5,
        "tokens_out": 1,
        "cost": 0.25,
        "attrs": {"answer": "x", "subqueries": 1},
    }
    events = [
        {**e, "cost": 0.25} if e["name"] == "SubQuery.Execute" and e["phase"] == "end" else e
        for e in events
    ]
    fields = run_fields([*events, done], Path("/tmp/x.otlp.json"))
    assert (fields["tokens_in"], fields["tokens_out"], str(fields["cost"])) == (5, 1, "0.25")


@pytest.mark.django_db
def test_the_live_workers_figures_leave_imported_runs_out() -> None:
    staff = get_user_model().objects.create_user("ops", is_staff=True)
    model = {"kind": "sim", "model": "frlm-sim-root", "base_url": ""}
    made = {"question": "q", "status": Run.Status.SUCCEEDED, "root_model": model}
    ran = Run.objects.create(**made, worker_model=model)
    Run.objects.create(**made, worker_model=model, context_source=Run.Source.IMPORTED)
    since = timezone.now() - timedelta(hours=1)
    recent, running = recent_run_ids(staff, since=since, limit=10, running_limit=10)
    assert (recent, running) == ([ran.id], [])


def test_a_folder_is_refused_as_a_folder(tmp_path) -> None:
    """It said 'no such file' of a folder that is there (a review)."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="is a folder: give one trace file"):
        call_command("frlm_import", str(tmp_path))


@pytest.mark.django_db
def test_an_imported_run_is_refused_a_replay_for_that_reason_alone() -> None:
    """The refusal went on to check the imported trace file as the run's context and told
    the user to move it under the context roots, which could not help (a review)."""
    from runs.services import RunInputError, run_replay

    model = {"kind": "sim", "model": "frlm-sim-root", "base_url": ""}
    imported = Run.objects.create(
        question="q",
        status=Run.Status.SUCCEEDED,
        root_model=model,
        worker_model=model,
        context_source=Run.Source.IMPORTED,
        context_path="/tmp/elsewhere/r1.otlp.json",
        venues=["no-such-venue"],
    )
    with pytest.raises(RunInputError) as refused:
        run_replay(imported)
    assert refused.value.errors == {
        "run": f"run {imported.id} was imported from a trace: it has no context to "
        "re-execute; replay the original run where it was recorded"
    }
