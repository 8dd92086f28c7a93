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


@pytest.mark.django_db
def test_it_removes_old_runs_context_copies_but_one_a_newer_run_reads(capsys):
    """FRLM's copies of a generated task's or an upload's context stayed forever (a review:
    162 MB after one session). A replay reads its source's copy: that one stays."""
    import json

    from runs.engine import context as ctx

    long_ago = timezone.now() - timedelta(days=40)

    def run(context_path: str = "", **fields) -> Run:
        made = Run.objects.create(
            question="q", context_source="task", root_model={}, worker_model={}, **fields
        )
        path = ctx.context_dir() / f"{made.id}.txt"
        made.context_path = context_path or str(path)
        made.save(update_fields=["context_path"])
        if not context_path:
            path.write_text("x" * 1000)
            ctx.index_file(path).write_text("{}")
        return made

    gone = run(status="succeeded", finished=long_ago)
    source = run(status="succeeded", finished=long_ago)
    replay = run(source.context_path, status="succeeded", finished=timezone.now())
    fresh = run(status="succeeded", finished=timezone.now())
    paths = {r.id: ctx.context_dir() / f"{r.id}.txt" for r in (gone, source, fresh)}

    data = json.loads(
        _out("frlm_prune", "--older-than", "30d", "--dry-run", "--json", capsys=capsys)
    )
    assert (data["contexts"], data["context_bytes"]) == (1, 1000)
    assert all(path.exists() for path in paths.values())  # a dry run removes nothing

    call_command("frlm_prune", older_than="30d")
    assert "and 1 context copy (0.0 MB)" in capsys.readouterr().out
    assert not paths[gone.id].exists() and not ctx.index_file(paths[gone.id]).exists()
    assert paths[source.id].exists() and replay.context_path == str(paths[source.id])
    assert paths[fresh.id].exists()


def _out(*args, capsys) -> str:
    capsys.readouterr()
    call_command(*args)
    return capsys.readouterr().out
