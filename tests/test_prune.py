from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from runs.models import Run
from tests.helpers import finish, launch, scripted, trace
from traces import blobs, store

pytestmark = [pytest.mark.stack]


def refs(events: list[dict]) -> set[str]:
    return {e["payload_ref"] for e in events if e["payload_ref"]}


def test_it_removes_old_runs_events_and_blobs_only_they_used(venues, capsys):
    old = finish(launch(question=scripted("FINAL(llm_query('only the old run asks this'))")))
    new = finish(launch(question=scripted("FINAL(llm_query('only the new run asks this'))")))
    old_refs, new_refs = refs(trace(old)), refs(trace(new))
    Run.objects.filter(id=old.id).update(finished=timezone.now() - timedelta(days=40))
    hours_ago = time.time() - 7200  # past the grace period that protects fresh blobs
    for ref in old_refs | new_refs:
        os.utime(blobs.blob_path(ref), (hours_ago, hours_ago))

    call_command("frlm_prune", older_than="30d")

    assert "removed the events of 1 run(s)" in capsys.readouterr().out
    assert store.read_events(old.id) == []
    assert store.read_events(new.id)
    assert all(blobs.blob_get(ref) is not None for ref in new_refs)  # shared ones too
    assert all(blobs.blob_get(ref) is None for ref in old_refs - new_refs)


def test_it_says_what_an_age_looks_like(venues):
    with pytest.raises(CommandError, match="like 30d, 12h or 90m"):
        call_command("frlm_prune", older_than="a month")
