"""Caps on what comes back: a model reply, a run's answer and an event's payload far longer
than any real model writes are cut, say so, and are never stored whole."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.helpers import endpoint, finish, launch, named, scripted, trace
from traces import caps
from traces.emitter import Emitter
from workers.backends import ModelSpec, chat
from workers.execution import reply_fields

HUGE = 3_000_000


@pytest.fixture
def flooding_endpoint() -> Iterator[str]:
    """An OpenAI-compatible endpoint (a broken or hostile one) that answers 3 M characters."""
    reply = json.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": "y" * HUGE}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7},
        }
    ).encode()
    with endpoint(lambda _request: (200, reply)) as (url, _seen):
        yield url


def test_a_huge_model_reply_is_cut_and_flagged(flooding_endpoint: str, settings) -> None:
    settings.FRLM_MAX_REPLY_CHARS = 10_000
    reply = chat(
        ModelSpec("openai", "any-model", flooding_endpoint), [{"role": "user", "content": "hi"}]
    )
    assert reply.cut_from == HUGE
    assert reply.text.startswith("y" * 10_000)
    assert reply.text.endswith(
        "[frlm: cut: 3,000,000 characters, the first 10,000 kept; FRLM_MAX_REPLY_CHARS sets "
        "the limit]"
    )
    assert len(reply.text) < 10_200
    # The worker's Execute span records the cut and carries only the cut text.
    fields = reply_fields(reply)
    assert fields["cut_from"] == HUGE and fields["payload"] == reply.text


def test_an_event_payload_is_cut_and_flagged(settings) -> None:
    settings.FRLM_MAX_REPLY_CHARS = 1_000
    event = Emitter(None, "rCaps").build(  # type: ignore[arg-type] - build sends nothing
        "SubQuery.Execute", "end", payload="p" * 50_000
    )
    assert event["attrs"]["payload_cut_from"] == 50_000
    assert len(event["attrs"]["_payload"]) < 1_200
    # Cut text passes again unchanged: no second cut, no second mark.
    once, _ = caps.cut("q" * 5_000, 1_000)
    assert caps.cut(once, 1_000) == (once, 0)


def test_a_huge_final_answer_is_cut_and_flagged(venues: list[str]) -> None:
    run = finish(launch(question=scripted(f"FINAL('z' * {HUGE})")))
    assert run.status == "succeeded", run.error
    limit = caps.DEFAULT_LIMIT  # the stack's conductor runs with the default
    assert len(run.answer) < limit + 200
    assert run.answer.startswith("z" * 1000)
    assert f"[frlm: cut: {HUGE:,} characters, the first {limit:,} kept" in run.answer
    (done,) = named(trace(run), "Run.Done")
    assert "payload_cut_from" not in done["attrs"]  # the answer was cut once, before it


def test_a_final_answer_the_database_cannot_hold_still_ends_the_run(venues: list[str]) -> None:
    """FINAL of a lone surrogate failed the row's write and left the run "running" for good,
    its lease already gone (found by a review): the character is replaced and the run ends."""
    run = finish(launch(question=scripted('FINAL("half \\ud800 a pair")')), timeout=60)
    assert run.status == "succeeded", run.error
    assert run.answer == "half ? a pair"
