"""Verification tiers as plain functions: agreement rules, the redundant tier's decisions,
objective checks, the adaptive replication gate, the overhead tally and attestations."""

from __future__ import annotations

import random

import pytest

from runs.trust.objective import function_verdict, objective_check
from runs.trust.verify import (
    Assignment,
    RedundancyPolicy,
    Reply,
    VerificationTally,
    consecutive_valid_after,
    cover,
    judgements,
    redundant_decide,
    should_replicate,
    should_validate,
    trusted_alone,
)
from traces.emitter import sha256_text
from workers import keys
from workers.agreement import AgreementRule, agree, normalise_exact, parse_number, similarity
from workers.attestation import attestation_build, attestation_problem, attestation_sign

EXACT = AgreementRule("exact")


def replies(*pairs: tuple[str, str]) -> list[Reply]:
    """Replies from workers w1, w2, ... on venues v1, v2, ... with spans s1, s2, ..."""
    return [Reply(worker_id=w, venue=f"v{w[1:]}", text=t, span_id=f"s{w[1:]}") for w, t in pairs]


# --- agreement rules -----------------------------------------------------------------------


def test_it_agrees_exactly_across_whitespace_and_case():
    assert normalise_exact("  The  Eiffel\nTower ") == "the eiffel tower"
    assert agree("Paris", "  paris\n", EXACT)
    assert not agree("Paris", "Paris, France", EXACT)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("42", 42.0),
        ("The answer is 42.", 42.0),
        ("Total: 1,234.5 tokens", 1234.5),
        ("-3", -3.0),
        ("about 2.5e3", 2500.0),
        ("42 (forty-two, i.e. 42)", 42.0),
        ("no number here", None),
        ("between 3 and 5", None),
        ("version v2", None),
    ],
)
def test_it_parses_the_one_number_of_a_short_answer(text, number):
    assert parse_number(text) == number


def test_it_agrees_on_numbers_within_the_tolerance_only():
    loose = AgreementRule("numeric", abs_tol=0.5)
    assert agree("There are 41 lines", "41.4", loose)
    assert not agree("41", "42", loose)
    assert agree("1e6", "1,000,000", AgreementRule("numeric"))
    assert agree("100", "101", AgreementRule("numeric", rel_tol=0.02))
    # A reply that names no single number agrees with nothing, not even its twin.
    assert not agree("some", "some", loose)


def test_it_measures_similarity_as_a_word_set_overlap():
    assert similarity("the cat sat", "sat the cat") == 1.0
    assert similarity("a b c d", "a b c e") == pytest.approx(3 / 5)
    assert similarity("", "") == 1.0
    assert similarity("x", "") == 0.0
    rule = AgreementRule("similar", threshold=0.6)
    assert agree("The launch window opens on May 4", "the launch window opens May 4", rule)
    assert not agree("The launch window opens on May 4", "nobody knows", rule)


def test_it_rejects_a_bad_rule_or_policy_with_a_clear_message():
    with pytest.raises(ValueError, match="mode must be one of"):
        AgreementRule("fuzzy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold"):
        AgreementRule("similar", threshold=0)
    with pytest.raises(ValueError, match="agree <= replicas <= max_replicas"):
        RedundancyPolicy(replicas=2, agree=3)
    with pytest.raises(ValueError, match="unknown setting"):
        RedundancyPolicy.from_dict({"replcas": 3})
    policy = RedundancyPolicy.from_dict(
        {"replicas": "3", "agree": 2, "mode": "numeric", "abs_tol": "0.5"}
    )
    assert (policy.replicas, policy.agree, policy.rule.mode, policy.rule.abs_tol) == (
        3,
        2,
        "numeric",
        0.5,
    )


# --- the redundant tier --------------------------------------------------------------------


def test_it_asks_for_m_replicas_first():
    decision = redundant_decide([], RedundancyPolicy(replicas=3, agree=2))
    assert (decision.outcome, decision.dispatch) == ("more", 3)


def test_it_accepts_when_n_agree_and_names_who_disagreed():
    got = replies(("w1", "Paris"), ("w2", "London"), ("w3", " paris"))
    decision = redundant_decide(got, RedundancyPolicy(replicas=3, agree=2))
    assert decision.outcome == "accept"
    assert decision.text == "Paris"
    assert decision.agreed == ("w1", "w3")
    assert decision.disagreed == ("w2",)
    assert decision.links == ("s1", "s2", "s3")
    attrs = decision.attrs()
    assert attrs["outcome"] == "accept" and attrs["groups"] == [["w1", "w3"], ["w2"]]
    assert judgements(decision) == {"w1": True, "w2": False, "w3": True}


def test_it_escalates_on_disagreement_away_from_used_workers_and_venues():
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=4)
    got = replies(("w1", "7"), ("w2", "9"))
    decision = redundant_decide(got, policy)
    assert decision.outcome == "more"
    assert decision.dispatch == 1
    assert decision.avoid_workers == {"w1", "w2"}
    assert decision.avoid_venues == {"v1", "v2"}

    # The extra replica sides with w2: accepted, w1 disagreed.
    decision = redundant_decide([*got, *replies(("w3", "9"))], policy)
    assert (decision.outcome, decision.text, decision.disagreed) == ("accept", "9", ("w1",))


def test_it_waits_while_replicas_in_flight_can_still_settle_it():
    policy = RedundancyPolicy(replicas=3, agree=2)
    in_flight = [Assignment("w2", "v2"), Assignment("w3", "v3")]
    decision = redundant_decide(replies(("w1", "A")), policy, in_flight)
    assert decision.outcome == "wait"
    assert decision.avoid_workers == {"w1", "w2", "w3"}
    # Only one in flight and it disagrees already with two? Then it cannot settle: more.
    decision = redundant_decide(
        replies(("w1", "A"), ("w2", "B")), RedundancyPolicy(3, 3, 5), [Assignment("w3", "v3")]
    )
    assert (decision.outcome, decision.dispatch) == ("more", 1)


def test_it_breaks_a_tie_with_another_replica_never_a_coin():
    policy = RedundancyPolicy(replicas=4, agree=2, max_replicas=5)
    got = replies(("w1", "A"), ("w2", "B"), ("w3", "A"), ("w4", "B"))
    decision = redundant_decide(got, policy)
    assert (decision.outcome, decision.dispatch) == ("more", 1)
    assert redundant_decide([*got, *replies(("w5", "B"))], policy).text == "B"


def test_one_worker_answering_twice_is_one_vote():
    # Issue 23: in a two-worker swarm the extra copies went back to the same two workers,
    # and a liar answering twice outvoted the honest worker, which was then judged wrong.
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=4)
    got = replies(("w1", "7"), ("w2", "9"), ("w2", "9"))
    decision = redundant_decide(got, policy)
    assert decision.outcome == "more"
    assert judgements(decision) == {}
    # Even out of replicas, repeated copies of one worker never make an answer.
    got = [*got, *replies(("w2", "9"))]
    decision = redundant_decide(got, policy)
    assert decision.outcome == "unresolved"
    assert judgements(decision) == {}
    # A second worker saying the same thing is a second vote.
    decision = redundant_decide([*got[:3], *replies(("w3", "9"))], policy)
    assert (decision.outcome, decision.text, decision.agreed) == ("accept", "9", ("w2", "w3"))
    assert judgements(decision) == {"w1": False, "w2": True, "w3": True}


def test_a_worker_caught_in_the_run_does_not_vote():
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=4)
    got = replies(("w1", "7"), ("w2", "9"))
    # w2 was caught lying earlier in the run: its "9" is not a vote, so w3's "9" alone is
    # not enough, and w2 is not credited when the answer is settled without it.
    decision = redundant_decide([*got, *replies(("w3", "9"))], policy, barred={"w2"})
    assert decision.outcome == "more"
    decision = redundant_decide([*got, *replies(("w3", "9"), ("w4", "9"))], policy, barred={"w2"})
    assert (decision.outcome, decision.agreed) == ("accept", ("w3", "w4"))
    assert judgements(decision) == {"w1": False, "w3": True, "w4": True}
    # A caught worker that disagrees with the accepted answer is judged wrong again.
    decision = redundant_decide(
        replies(("w1", "7"), ("w2", "9"), ("w3", "7")), policy, barred={"w2"}
    )
    assert (decision.outcome, decision.text) == ("accept", "7")
    assert judgements(decision) == {"w1": True, "w2": False, "w3": True}


def test_a_trusted_worker_settles_a_tie_it_is_on_one_side_of():
    # A stranger and the operator's own worker disagree, with nobody else to ask: the tie
    # went unresolved ("no answer is guessed") and the stranger was never judged wrong.
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=3)
    got = replies(("w1", "7"), ("w2", "9"))
    assert redundant_decide(got, policy).outcome == "more"
    decision = redundant_decide(got, policy, trusted={"w2"})
    assert (decision.outcome, decision.text, decision.agreed) == ("accept", "9", ("w2",))
    assert decision.reason == "1 against 1: a trusted worker's answer"
    assert judgements(decision) == {"w1": False, "w2": True}
    # Against a worker caught lying earlier in the run (no vote, but not agreeing either).
    decision = redundant_decide(got, policy, barred={"w1"}, trusted={"w2"})
    assert (decision.outcome, decision.text) == ("accept", "9")
    assert decision.reason == "1 against a worker caught lying: a trusted worker's answer"
    assert judgements(decision) == {"w1": False, "w2": True}


def test_a_trusted_worker_breaks_ties_only_and_asks_again_when_trusted_workers_differ():
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=4)
    # Votes decide first: two strangers agreeing outvote the trusted worker.
    decision = redundant_decide(
        replies(("w1", "7"), ("w2", "9"), ("w3", "7")), policy, trusted={"w2"}
    )
    assert (decision.outcome, decision.text) == ("accept", "7")
    # Two trusted workers that differ settle nothing: another replica does.
    decision = redundant_decide(replies(("w1", "7"), ("w2", "9")), policy, trusted={"w1", "w2"})
    assert decision.outcome == "more"
    # A trusted answer nobody disagrees with still needs its agreement, as a sampled
    # trusted answer is checked by another worker's copy.
    assert redundant_decide(replies(("w2", "9")), policy, trusted={"w2"}).outcome == "more"


def test_a_trusted_answer_nobody_is_left_to_check_stands_unchecked():
    # Its sampled check had nobody to go to but a worker caught lying: the sub-query came
    # out "[frlm:unresolved] 1 workers never agreed".
    got = replies(("w2", "9"))
    decision = trusted_alone(got, EXACT, trusted={"w2"})
    assert (decision.outcome, decision.text) == ("accept", "9")
    assert judgements(decision) == {}  # unchecked: nobody credited, nobody blamed
    # A caught worker's copy that disagrees is judged wrong again.
    decision = trusted_alone([*got, *replies(("w1", "7"))], EXACT, {"w1"}, {"w2"})
    assert judgements(decision) == {"w1": False}
    # Not for a stranger's answer, nor for trusted workers that differ.
    assert trusted_alone(replies(("w1", "7")), EXACT, trusted={"w2"}) is None
    assert trusted_alone(replies(("w1", "7"), ("w2", "9")), EXACT, trusted={"w1", "w2"}) is None


def test_every_untrusted_worker_of_a_batch_takes_part_in_a_check():
    # Eight untrusted workers with eight answers each, and one trusted worker: two sampled
    # checks cover their owners and, through where their copies go, two more workers; the
    # four left are paired, one's answer going to the other.
    owners = {pos: f"w{pos % 9}" for pos in range(72)}
    untrusted = {f"w{i}" for i in range(8)}  # w8 is trusted: nobody needs to check it
    checkers = untrusted | {"w8"}
    plan = cover(owners, untrusted, [0, 1], checkers, random.Random(7))
    assert len(plan.extra) == 2  # four workers left: one copy per pair
    assert set(plan.pins) == {0, 1, *plan.extra}
    involved = {owners[p] for p in [0, 1, *plan.extra]} | set(plan.pins.values())
    assert involved == untrusted
    for pos, target in plan.pins.items():
        assert target != owners[pos] and target in untrusted  # never a worker's own answer


def test_cover_adds_nothing_when_the_sampled_checks_involve_everyone():
    owners = {0: "a", 1: "b", 2: "c", 3: "d"}
    plan = cover(owners, {"a", "b", "c", "d"}, [0, 2], {"a", "b", "c", "d"}, random.Random(1))
    assert plan.extra == []
    assert {plan.pins[0], plan.pins[2]} == {"b", "d"}


def test_a_lone_worker_left_is_checked_by_anyone():
    # Three workers, none sampled: a pair, and the third's answer copied wherever the
    # scheduler sends it (no worker left uncovered to pin it to).
    owners = {0: "a", 1: "b", 2: "c"}
    plan = cover(owners, {"a", "b", "c"}, [], {"a", "b", "c"}, random.Random(3))
    assert len(plan.extra) == 2 and len(plan.pins) == 1
    involved = {owners[p] for p in plan.extra} | set(plan.pins.values())
    assert involved == {"a", "b", "c"}


def test_it_marks_a_sub_query_unresolved_when_replicas_never_agree():
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=4)
    got = replies(("w1", "1"), ("w2", "2"), ("w3", "3"), ("w4", "4"))
    decision = redundant_decide(got, policy)
    assert decision.outcome == "unresolved"
    assert decision.text is None
    assert decision.agreed == ()
    assert "no answer reached 2 agreeing replies" in decision.reason
    assert decision.attrs()["groups"] == [["w1"], ["w2"], ["w3"], ["w4"]]
    assert judgements(decision) == {}


def test_it_gives_up_early_when_agreement_is_out_of_reach():
    # Three agreeing needed, five at most: after four different answers one more cannot do.
    policy = RedundancyPolicy(replicas=3, agree=3, max_replicas=5)
    got = replies(("w1", "1"), ("w2", "2"), ("w3", "3"), ("w4", "4"))
    assert redundant_decide(got, policy).outcome == "unresolved"


def test_it_judges_numeric_and_similar_replies_by_their_rule():
    numeric = RedundancyPolicy(2, 2, 3, AgreementRule("numeric", abs_tol=0.01))
    decision = redundant_decide(replies(("w1", "The sum is 12.00"), ("w2", "12")), numeric)
    assert decision.outcome == "accept"
    similar = RedundancyPolicy(2, 2, 3, AgreementRule("similar", threshold=0.7))
    decision = redundant_decide(
        replies(("w1", "the needle is in file 7"), ("w2", "The needle is in file 7.")), similar
    )
    assert decision.outcome == "accept"


# --- objective checks ----------------------------------------------------------------------


def test_it_checks_replies_against_a_json_schema():
    check = objective_check(
        {
            "type": "object",
            "properties": {"count": {"type": "integer", "minimum": 0}},
            "required": ["count"],
        }
    )
    assert check('{"count": 3}').ok
    bad = check('{"count": -1}')
    assert not bad.ok and bad.check == "schema"
    assert "/count" in bad.reason and "minimum" in bad.reason
    assert "not JSON" in check("three").reason
    # A worker's answer nested deeper than the decoder recurses is a failed check, not a
    # RecursionError out of the judge (found by a review).
    deep = check("[" * 5000 + "]" * 5000)
    assert not deep.ok and "nested too deeply" in deep.reason
    assert "'count' is a required property" in check("{}").reason


def test_it_refuses_a_schema_that_is_not_one():
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        objective_check({"type": "no-such-type"})
    with pytest.raises(ValueError, match="validate= takes"):
        objective_check(42)  # type: ignore[arg-type]


def test_it_checks_the_whole_reply_against_a_regex():
    check = objective_check(r"\d{4}-\d{2}-\d{2}")
    assert check(" 2026-05-04\n").ok
    verdict = check("on 2026-05-04")
    assert not verdict.ok and verdict.attrs() == {
        "tier": "objective",
        "check": "regex",
        "ok": False,
        "reason": "does not match '\\\\d{4}-\\\\d{2}-\\\\d{2}'",
    }
    with pytest.raises(ValueError, match="not a valid regular expression"):
        objective_check("([")


def test_it_turns_a_check_function_outcome_into_a_verdict():
    assert function_verdict(True).ok
    assert function_verdict(False).reason == "the check returned False"
    raised = function_verdict(None, "ZeroDivisionError: division by zero")
    assert not raised.ok and "ZeroDivisionError" in raised.reason


# --- adaptive replication ------------------------------------------------------------------


def test_it_always_replicates_a_worker_below_ten_consecutive_valid():
    rng = random.Random(1)
    assert all(should_replicate(count, rng) for count in range(10) for _ in range(50))


def test_it_replicates_a_trusted_worker_with_probability_one_over_its_count():
    rng = random.Random(7)
    for count, expected in ((10, 0.1), (40, 0.025)):
        rate = sum(should_replicate(count, rng) for _ in range(20_000)) / 20_000
        assert rate == pytest.approx(expected, rel=0.15)


def test_it_resets_the_count_on_one_invalid_result():
    count = 0
    for _ in range(25):
        count = consecutive_valid_after(count, True)
    assert count == 25
    assert consecutive_valid_after(count, False) == 0
    assert should_replicate(consecutive_valid_after(count, False), random.Random(0))


def test_it_samples_answers_of_untrusted_workers_for_validation_more_often():
    rng = random.Random(3)

    def rate(counts: list[int]) -> float:
        return sum(should_validate(counts, rng) for _ in range(20_000)) / 20_000

    assert rate([0, 4]) == pytest.approx(0.5, rel=0.05)
    assert rate([3, 12]) == pytest.approx(0.02, rel=0.2)
    assert not any(should_validate([50], rng, trusted_rate=0.0) for _ in range(1000))
    with pytest.raises(ValueError, match="fractions between 0 and 1"):
        should_validate([1], rng, untrusted_rate=2)
    # A worker a validator caught is re-run every time, whatever its count.
    assert all(should_validate([50], rng, trusted_rate=0.0, suspect=True) for _ in range(100))


def test_it_tallies_the_share_of_extra_sub_queries_per_run():
    tally = VerificationTally()
    assert tally.figures()["overhead"] == 0.0
    tally.add_primary(100)
    tally.add_extra("replica", 20)
    tally.add_extra("validator", 5)
    figures = tally.figures()
    assert figures["extra"] == 25
    assert figures["by_kind"] == {"replica": 20, "validator": 5}
    assert figures["overhead"] == pytest.approx(0.25)
    assert figures["share"] == pytest.approx(25 / 125)


# --- attestations --------------------------------------------------------------------------


def attest(worker_output: str, validator_output: str, rule: AgreementRule = EXACT) -> dict:
    return attestation_build(
        run_id="r1",
        span_id="sp1",
        subquery_id="sq1",
        worker_id="w1",
        validator_id="v9",
        prompt="How many?",
        worker_output=worker_output,
        validator_output=validator_output,
        rule=rule,
    )


def test_it_signs_an_attestation_that_anyone_can_check():
    validator = keys.generate()
    signed = attestation_sign(attest("12", "12"), validator)
    att = signed["attestation"]
    assert att["verdict"] == "agree"
    assert att["input_sha256"] == sha256_text("How many?")
    assert att["worker_output_sha256"] == att["validator_output_sha256"] == sha256_text("12")
    assert att["time"].endswith("Z")
    assert attestation_problem(signed) is None
    assert attestation_problem(signed, validator_key=keys.public_b64(validator)) is None


def test_it_attests_a_divergence():
    signed = attestation_sign(attest("12", "13"), keys.generate())
    assert signed["attestation"]["verdict"] == "diverge"
    assert attestation_problem(signed) is None
    loose = attest("12", "13", AgreementRule("numeric", abs_tol=1))
    assert loose["verdict"] == "agree"


def test_it_detects_an_altered_or_foreign_attestation():
    validator = keys.generate()
    signed = attestation_sign(attest("12", "13"), validator)
    forged = {**signed, "attestation": {**signed["attestation"], "verdict": "agree"}}
    assert "bad signature" in attestation_problem(forged)
    impostor = attestation_sign(attest("12", "13"), keys.generate())
    assert "registered key" in attestation_problem(
        impostor, validator_key=keys.public_b64(validator)
    )
    assert "lacks" in attestation_problem({"attestation": {"run": "r1"}})


def test_it_refuses_a_worker_validating_itself():
    with pytest.raises(ValueError, match="cannot validate its own"):
        attestation_build(
            run_id="r",
            span_id="s",
            subquery_id="q",
            worker_id="w1",
            validator_id="w1",
            prompt="p",
            worker_output="a",
            validator_output="a",
            rule=EXACT,
        )
