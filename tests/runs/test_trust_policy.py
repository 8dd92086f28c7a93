"""The checking policy for workers nobody vouches for (issue 23), as plain functions: the
rate a worker is checked at, the sampler that picks which answers, and known-answer probes."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from runs.engine.policy import Policy, PolicyError
from runs.trust.probes import make_probe, probe_count, probe_passed, sentences_of
from runs.trust.verify import CheckRule, Sampler, VerificationTally
from workers.sim.reader import answer_prompt, wrong_answer

BATCH = [f"Where is station {i}?\nStation {i} is north of the river." for i in range(40)]


def test_it_checks_every_answer_of_a_new_worker():
    rule = CheckRule(floor=0.06, warmup=10)
    assert all(rule.rate(n) == 1.0 for n in range(10))
    assert "new worker" in rule.why(3)


def test_it_never_lets_the_rate_fall_below_the_floor():
    rule = CheckRule(floor=0.06, warmup=10)
    assert rule.rate(10) == 0.06  # past the warm-up: the floor, however long the record
    assert rule.rate(1000) == 0.06
    assert "floor" in rule.why(1000)


def test_it_checks_every_answer_of_a_suspect_whatever_its_record():
    assert CheckRule(floor=0.0).rate(10_000, suspect=True) == 1.0


def test_it_lets_the_high_trust_tier_set_a_new_workers_rate():
    assert CheckRule(warmup=10, new_rate=0.5).rate(3) == 0.5


def test_it_never_leaves_a_worker_more_than_one_over_its_rate_answers_unchecked():
    sampler = Sampler(random.Random(7))
    picks = [sampler.take("w", 0.06) for _ in range(1000)]
    checked = [i for i, p in enumerate(picks) if p]
    gaps = [b - a for a, b in zip(checked, checked[1:], strict=False)]
    assert 55 <= len(checked) <= 65
    assert max(gaps) <= 17 and checked[0] <= 17


def test_a_check_the_gate_made_counts_toward_the_workers_rate():
    # Batches of 10 answers per worker, each with one gate check: at a 6% floor the
    # sample adds none (the gate's check is the worker's check for the batch); with 100
    # answers per batch it adds the rest of the floor, so the rate never falls under it.
    for answers, (least, most) in ((10, (0, 2)), (100, (100, 101))):
        sampler = Sampler(random.Random(3))
        sampled = 0
        for _ in range(20):  # batches
            sampler.spend("w")
            sampled += sum(sampler.take("w", 0.06) for _ in range(answers))
        assert least <= sampled <= most
        assert 20 + sampled >= 0.06 * answers * 20  # checks in all: never under the floor
    # Credit kept across runs may be as low as -1, no lower.
    sampler = Sampler(random.Random(3))
    for _ in range(5):
        sampler.spend("w")
    assert sampler._credit["w"] == -1.0


def test_a_check_counts_toward_the_floor_only_once_the_worker_is_sampled():
    # In its warm-up (or as a suspect) every answer of a worker is checked anyway: the
    # gate's checks then spent its credit down to -1, and its first floor check after the
    # warm-up came 2/floor answers later, not within 1/floor.
    rule = CheckRule(floor=0.04, warmup=10)
    assert not rule.counts(3) and not rule.counts(500, suspect=True)
    assert rule.counts(10) and rule.counts(500)
    assert CheckRule(floor=0.04, warmup=10, new_rate=0.5).counts(3)  # sampled in warm-up too


def test_it_starts_each_worker_at_a_phase_it_cannot_know():
    firsts = set()
    for seed in range(20):
        sampler = Sampler(random.Random(seed))
        firsts.add(next(i for i in range(100) if sampler.take("w", 0.1)))
    assert len(firsts) >= 5


def test_it_builds_a_probe_from_the_batchs_own_text_that_an_honest_reader_answers():
    rng = random.Random(1)
    for _ in range(50):
        probe = make_probe(BATCH, rng)
        assert probe.source == "context"
        assert probe.answer in probe.prompt
        assert probe_passed(probe, answer_prompt(probe.prompt))
        assert not probe_passed(probe, wrong_answer(probe.prompt, random.Random(3)))


def test_it_fails_a_near_miss_that_differs_from_the_answer_in_one_word():
    batch = [f"Where is station 12-{i}?\nStation 12-{i} is north of the river." for i in range(30)]
    rng = random.Random(4)
    for _ in range(200):
        probe = make_probe(batch, rng)
        assert probe_passed(probe, answer_prompt(probe.prompt))
        assert probe_passed(probe, f"The sentence is: {probe.answer}")
        for seed in range(3):
            assert not probe_passed(probe, wrong_answer(probe.prompt, random.Random(seed)))


def test_it_falls_back_to_the_probe_bank_when_the_batch_has_no_text():
    probe = make_probe(["What is two and two?"], random.Random(2))
    assert probe.source == "bank"
    assert probe_passed(probe, answer_prompt(probe.prompt))
    assert probe_passed(probe, f'"{probe.answer}"')  # a quoted answer is still the answer


def test_it_keeps_sentences_that_would_tie_with_the_answer_out_of_a_probe():
    assert sentences_of(["Q\nThis sentence mentions nothing. The mill is old."]) == [
        "The mill is old."
    ]


def test_it_takes_no_probe_sentence_from_a_label_line_of_the_program():
    """A combine prompt's QUESTION line of several sentences: the ones after its first
    (the question's own instructions) made probes that honest workers failed, and were
    counted as liars for it (a review, on a repoqa suite)."""
    from workers.sim.strategies import combine_prompt_header

    question = (
        "How many functions in module encodings.utf_8 call `encode`? Count each function "
        "or method once if its own body (not a nested function or class) calls "
        "`encode(...)` or `something.encode(...)`. Answer with the number only."
    )
    combine = combine_prompt_header(question) + "- 3\n- 4\n- 3"
    assert sentences_of([combine, combine.replace("utf_8", "latin_1")]) == []
    # A question of several lines (the launcher's, CRLF read as LF), and partial answers
    # of several lines: none of it is text to read.
    lines = combine_prompt_header(question.replace("? ", "?\n")) + "- the answer is 3.\nIt is."
    assert sentences_of([lines]) == []
    probe = make_probe([combine], random.Random(1))
    assert probe.source == "bank" and probe_passed(probe, answer_prompt(probe.prompt))


def test_it_mixes_in_the_expected_share_of_probes():
    rng = random.Random(5)
    assert probe_count(100, 0.02, rng) == 2
    assert sum(probe_count(10, 0.05, rng) for _ in range(2000)) == pytest.approx(1000, rel=0.1)
    assert probe_count(100, 0.0, rng) == 0


def test_it_counts_what_checking_cost():
    tally = VerificationTally()
    tally.add_primary(10)
    tally.add_extra("probe")
    tally.add_cost("probe", Decimal("0.1"))
    tally.add_cost("probe", Decimal("0.2"))
    tally.add_cost("replica", Decimal("0.00005"))
    figures = tally.figures()
    # Exact dollars, spelt as money strings in the run's accounts (no 0.30000000000000004).
    assert figures["cost"] == "0.30005" and figures["cost_by_kind"]["probe"] == "0.3"


def test_it_takes_the_checking_policy_keys_and_refuses_bad_ones():
    policy = Policy.from_dict({"check_floor": "0.1", "probe_rate": 0.05, "check_warmup": 3})
    assert (policy.check_floor, policy.probe_rate, policy.check_warmup) == (0.1, 0.05, 3)
    with pytest.raises(PolicyError, match="policy.check_floor must be between 0.0 and 1.0"):
        Policy.from_dict({"check_floor": 2})
    with pytest.raises(PolicyError, match="policy.lie_penalty"):
        Policy.from_dict({"lie_penalty": 0})
    assert Policy().check_cover == "gate"
    assert Policy.from_dict({"check_cover": "first"}).check_cover == "first"
    assert Policy.from_dict({"check_cover": "off"}).check_cover == "off"
    assert Policy.from_dict({"check_cover": "batch"}).check_cover == "batch"
    with pytest.raises(
        PolicyError, match="policy.check_cover must be one of gate, first, batch, off"
    ):
        Policy.from_dict({"check_cover": "always"})


def _real_prompts(header: str, n: int) -> list[str]:
    """Prompts as the conductor holds them: the program's header over a fragment marker
    that the worker, not the conductor, turns into text."""
    marker = '<<frlm:fragment {"path":"/srv/ctx.txt","chars":[%d,%d],"sha256":"ab"}>>'
    return [header + marker % (i * 100, i * 100 + 100) for i in range(n)]


@pytest.mark.parametrize(
    "header",
    [
        "Find the special magic number for 'amber-fox' in the text below. "
        "Reply with the number only, or NONE if it is not there.\n\nTEXT:\n",
        "Answer the question using only the excerpt below. Reply NONE if the excerpt "
        "does not help.\n\nQUESTION: Which module defines fsum?\n\nEXCERPT:\n",
    ],
)
def test_it_builds_no_probe_from_a_fragment_marker_or_the_programs_instructions(header):
    """Seen in the default experiment suite: probes quoted `<<frlm:fragment ...>>` and the
    header's own lines, which no honest worker can give back (it reads the fragment's text
    in the marker's place): every honest worker failed them and was punished as a liar."""
    rng = random.Random(5)
    prompts = _real_prompts(header, 20)
    assert sentences_of(prompts) == []
    for _ in range(30):
        probe = make_probe(prompts, rng)
        assert "<<frlm:" not in probe.prompt and "TEXT:" not in probe.prompt
        assert probe_passed(probe, answer_prompt(probe.prompt))


def test_it_builds_probes_from_a_prompts_own_excerpt_text():
    header = "Answer the question using only the excerpt below.\n\nQUESTION: Where?\n\nEXCERPT:\n"
    text = "Station {} is north of the river. It opened in 19{:02d}."
    prompts = [header + text.format(i, i) for i in range(9)]
    pool = sentences_of(prompts)
    assert pool and all("QUESTION" not in s and "excerpt" not in s.lower() for s in pool)
    probe = make_probe(prompts, random.Random(1))
    assert probe.source == "context"
    assert probe_passed(probe, answer_prompt(probe.prompt))
