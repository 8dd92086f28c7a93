from __future__ import annotations

import os
import signal
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


def test_it_removes_old_runs_events_and_blobs_only_they_used(stack, venues, capsys):
    old = finish(launch(question=scripted("FINAL(llm_query('only the old run asks this'))")))
    new = finish(launch(question=scripted("FINAL(llm_query('only the new run asks this'))")))
    old_refs, new_refs = refs(trace(old)), refs(trace(new))
    Run.objects.filter(id=old.id).update(finished=timezone.now() - timedelta(days=40))
    # The recorder's own pack is never rewritten: a restarted recorder starts a new one.
    stack.kill("recorder", signal.SIGTERM)
    stack.restart("recorder")
    hours_ago = time.time() - 7200  # past the grace period that protects fresh blobs
    for path in blobs.pack_dir().glob("*.idx"):
        os.utime(path, (hours_ago, hours_ago))

    call_command("frlm_prune", older_than="30d")

    assert "removed the events of 1 run(s)" in capsys.readouterr().out
    assert store.read_events(old.id) == []
    assert store.read_events(new.id)
    assert all(blobs.blob_get(ref) is not None for ref in new_refs)  # shared ones too
    assert all(blobs.blob_get(ref) is None for ref in old_refs - new_refs)


def test_it_removes_unused_blob_files_of_the_layout_before_packs(venues, settings):
    used = finish(launch(question=scripted("FINAL(llm_query('a question kept'))")))
    orphan = blobs.blob_path("ab" * 32)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_text("nobody refers to this")
    hours_ago = time.time() - 7200
    os.utime(orphan, (hours_ago, hours_ago))

    call_command("frlm_prune", older_than="30d")

    assert not orphan.exists()
    assert all(blobs.blob_get(ref) is not None for ref in refs(trace(used)))


def test_it_refuses_an_age_longer_than_a_century_with_a_reason(venues):
    """99999999999d and 1000000d ended in OverflowError tracebacks (found by a review)."""
    for age in ("99999999999d", "1000000d", "876001h", "52560001m"):
        with pytest.raises(CommandError, match="at most 36500d"):
            call_command("frlm_prune", older_than=age, dry_run=True)
    call_command("frlm_prune", older_than="36500d", dry_run=True)


def test_it_says_what_an_age_looks_like(venues):
    with pytest.raises(CommandError, match="like 30d, 12h or 90m"):
        call_command("frlm_prune", older_than="a month")
