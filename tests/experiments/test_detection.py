"""Table 4 counts verdicts on untrusted workers' replies only, from events stored by the real
emitter and recorder: a trusted worker's agreeing vote is no honest worker's verdict, a
validator's refused attestation is no verdict on the judged worker, and the false
positives known-answer probes make are shown apart from the other verifiers'."""

from __future__ import annotations

import pytest

from runs.experiments.measures import load_traces, verdicts
from runs.experiments.tables import detection_table
from tests.redisdb import private_redis  # noqa: F401 - the `client` fixture
from traces.emitter import Emitter
from traces.recorder import Recorder
from workers.models import Venue, Worker


def _worker(venue: Venue, name: str) -> str:
    return Worker.objects.create(name=name, venue=venue, public_key="k" * 44).id


@pytest.mark.django_db
def test_it_counts_honest_untrusted_replies_and_splits_off_probes(client):
    edge = Venue.objects.create(name="fp-edge", kind="edge", trusted=False)
    dc = Venue.objects.create(name="fp-dc", kind="datacenter", trusted=True)
    honest, liar = _worker(edge, "fp-edge-1"), _worker(edge, "fp-edge-2")
    validator = _worker(dc, "fp-dc-1")

    emitter = Emitter(client, "rFP")
    with emitter.span("Run.Init") as run:
        p = run.span_id
        # Redundancy: the honest worker and the trusted one agree, the liar is outvoted.
        emitter.instant(
            "Verify.Redundant",
            parent=p,
            status="ok",
            outcome="accept",
            agreed=[honest, validator],
            disagreed=[liar],
            groups=[[honest, validator], [liar]],
        )
        # An unresolved vote: neither reply is accepted.
        emitter.instant(
            "Verify.Redundant",
            parent=p,
            status="rejected",
            outcome="unresolved",
            agreed=[],
            disagreed=[],
            groups=[[liar], [honest]],
        )
        # A validator attests the honest reply; then its own attestation is refused (the
        # event names the validator, not the judged worker); then it gives no answer.
        signed = {"attestation": {"verdict": "agree", "worker": honest}, "signature": "s"}
        emitter.instant("Verify.Attest", parent=p, status="ok", worker_id=honest, attrs=signed)
        emitter.instant(
            "Verify.Attest",
            parent=p,
            status="rejected",
            worker_id=validator,
            reason="attestation refused: bad signature",
        )
        emitter.instant(
            "Verify.Attest", parent=p, status="error", worker_id=honest, reason="no answer"
        )
        # Known-answer probes: the honest worker fails one, the liar fails one.
        emitter.instant("Verify.Probe", parent=p, status="rejected", worker_id=honest, ok=False)
        emitter.instant("Verify.Probe", parent=p, status="ok", worker_id=honest, ok=True)
        emitter.instant("Verify.Probe", parent=p, status="rejected", worker_id=liar, ok=False)
        # An objective check the liar fails.
        emitter.instant("Verify.Objective", parent=p, status="rejected", worker_id=liar)
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()

    traces = load_traces(["rFP"])
    judged = verdicts(traces["rFP"])
    assert sorted((w, ok, how) for w, ok, how in judged if w == honest) == [
        (honest, False, "probe"),
        (honest, False, "redundancy"),  # the unresolved vote
        (honest, True, "attestation"),
        (honest, True, "probe"),
        (honest, True, "redundancy"),
    ]
    assert validator not in {w for w, _, how in judged if how == "attestation"}

    suite = {"federation": {"venues": [{"name": "fp-edge", "liars": ["fp-edge-2"]}]}}
    # A baseline whose run passed no verdict (no verifier) gets no row, and no error.
    rows = [{"run_id": "rFP", "baseline": "fed_x"}, {"run_id": "rNONE", "baseline": "local"}]
    table = detection_table(rows, traces, suite, None)
    (row,) = table["rows"]
    values = row["values"]
    assert row["label"] == {"baseline": "fed_x", "workers": "lying"}
    # The liar: outvoted, unresolved, failed a probe and a check: 4 of 4 not accepted.
    assert (values["judged"], values["not_accepted"]) == (4, 4)
    assert values["detection_rate"] == 1.0
    # The honest untrusted worker only (the trusted one's agreeing vote is not counted):
    # 5 verdicts, 2 not accepted, one of them a probe's.
    assert (values["honest_judged"], values["honest_not_accepted"]) == (5, 2)
    assert values["false_positive_rate"] == pytest.approx(2 / 5)
    assert values["honest_probe_not_accepted"] == 1
    assert values["honest_judged_without_probes"] == 3
    assert values["fp_rate_without_probes"] == pytest.approx(1 / 3)
    assert "local/lying" in table["note"]
    assert "trusted" in table["note"] and "probe" in table["note"]
