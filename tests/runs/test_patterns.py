"""The program patterns of the REPL (runs/sandbox/patterns.py), run over a real lazy context
with the simulated worker reading each prompt's fragments, as on a venue; every step must go
out as a batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runs.sandbox import patterns
from runs.sandbox.lazytext import LazyText
from workers.fragments import fill
from workers.sim.reader import answer_prompt

QUESTION = "What is the special magic number for amber-delta mentioned in the provided text?"
NEEDLE = "One of the special magic numbers for amber-delta is: 4417723. "


class Workers:
    """llm_query / llm_query_batched / rlm_query as the fanout would answer them."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.single = 0
        self.rlm: list[Any] = []
        self.tiers: list[str | None] = []

    def llm_query(self, prompt: str, tier: str | None = None) -> str:
        self.single += 1
        self.tiers.append(tier)
        return answer_prompt(fill(prompt)[0])

    def llm_query_batched(self, prompts: list[str], tier: str | None = None) -> list[str]:
        self.batches.append(len(prompts))
        self.tiers.append(tier)
        return [answer_prompt(fill(p)[0]) for p in prompts]

    def rlm_query(self, prompt: str, context: Any = None) -> str:
        self.rlm.append(context)
        return answer_prompt(f"{prompt}\n\nTEXT:\n{context.text()}")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Workers, dict[str, Any], LazyText]:
    text = "Filler about the weather and the harbour. " * 4000 + NEEDLE
    text += "More filler about the market. " * 4000
    path = tmp_path / "context.txt"
    path.write_text(text)
    context = LazyText(str(path))
    workers = Workers()
    functions = patterns.Functions(
        llm_query=workers.llm_query,
        llm_query_batched=workers.llm_query_batched,
        rlm_query=workers.rlm_query,
        context=context,
    )
    return workers, patterns.bind(functions), context


def test_it_maps_every_fragment_in_one_batch_then_reduces(setup: Any) -> None:
    workers, bound, context = setup
    assert bound["map_reduce"](QUESTION, chunk_size=20_000) == "4417723"
    assert workers.batches == [len(context.chunks(20_000, 200))]
    counted = bound["map_reduce"](QUESTION, chunk_size=20_000, reduce=lambda replies: len(replies))
    assert counted == 1


def test_map_reduce_with_no_useful_reply_says_so_rather_than_none(setup: Any) -> None:
    """A run's FINAL(map_reduce(...)) over a context that does not answer said "None", and
    the run "succeeded" (a review)."""
    workers, bound, _context = setup
    elsewhere = "What is the special magic number for violet-omega mentioned in the text?"
    assert bound["map_reduce"](elsewhere, chunk_size=20_000) == patterns.NOT_FOUND
    assert bound["map_reduce"](elsewhere, chunk_size=20_000, reduce=len) == 0
    # refine has nothing to improve: it stops (it "improved" NOT_FOUND into a guess).
    workers.batches.clear()
    assert bound["refine"](elsewhere, chunk_size=20_000) == patterns.NOT_FOUND
    assert len(workers.batches) == 1  # the map only, no rounds


def test_map_reduce_whose_every_sub_query_failed_says_so_not_that_nothing_answers(
    setup: Any,
) -> None:
    """A budget stop's markers read as "No part of the context answers the question.", a
    claim about the context that no sub-query made (a review)."""
    workers, bound, _context = setup
    workers.llm_query_batched = lambda prompts, tier=None: [  # type: ignore[method-assign]
        f"[frlm:budget] sub-query {i}: run budget reached" for i, _ in enumerate(prompts)
    ]
    functions = patterns.Functions(
        llm_query=workers.llm_query,
        llm_query_batched=workers.llm_query_batched,
        rlm_query=workers.rlm_query,
        context=_context,
    )
    said = patterns.bind(functions)["map_reduce"](QUESTION, chunk_size=20_000)
    assert said.startswith(patterns.NO_ANSWER + " (")
    assert "failed; first: [frlm:budget] sub-query 0: run budget reached" in said
    assert patterns.bind(functions)["refine"](QUESTION, chunk_size=20_000) == said


def test_it_decomposes_to_the_depth_bound_with_one_batch_per_level(setup: Any) -> None:
    workers, bound, context = setup
    assert bound["decompose"](QUESTION, depth=2, split=4, leaf_chars=20_000) == "4417723"
    # 16 leaves at depth 2 asked together; nothing to combine (one useful reply).
    assert workers.batches == [16]
    workers.batches.clear()
    assert bound["decompose"](QUESTION, depth=1, split=3, leaf_chars=1_000) == "4417723"
    assert workers.batches == [3]  # the depth bound stops the split


def test_it_hands_parts_to_child_rlms(setup: Any) -> None:
    workers, bound, _context = setup
    assert bound["decompose"](QUESTION, depth=1, split=2, use_rlm=True) == "4417723"
    assert len(workers.rlm) == 2 and all(hasattr(part, "byte_start") for part in workers.rlm)


def test_it_refines_and_stops_early_when_nothing_changes(setup: Any) -> None:
    workers, bound, _context = setup
    answer = bound["refine"](QUESTION, chunk_size=40_000, rounds=5, draft="1234567")
    assert answer == "4417723"
    # Round one corrects the draft, round two changes nothing: two batches, not five.
    assert len(workers.batches) == 2
    workers.batches.clear()
    kept = bound["refine"](QUESTION, rounds=5, draft="4417723", accept=lambda d: d.isdigit())
    assert kept == "4417723" and workers.batches == []


def test_it_searches_the_tree_keeping_only_the_best_branches(setup: Any) -> None:
    workers, bound, context = setup
    answer = bound["tree_search"](QUESTION, beam=2, branch=4, leaf_chars=10_000)
    assert answer == "4417723"
    # Level one scores 4 parts, level two 2 x 4 (the beam), level three 2 x 4 again, then
    # the 2 best leaves are asked: the rest of the context was pruned unread.
    assert workers.batches == [4, 8, 8, 2]
    assert sum(workers.batches) * 10_000 < len(context) * 2


def test_it_sends_every_sub_query_of_a_pattern_under_the_tier_asked(setup: Any) -> None:
    workers, bound, _context = setup
    assert bound["map_reduce"](QUESTION, chunk_size=20_000, tier="redundant") == "4417723"
    assert workers.tiers and set(workers.tiers) == {"redundant"}
    workers.tiers.clear()
    bound["map_reduce"](QUESTION, chunk_size=20_000)
    assert set(workers.tiers) == {None}
