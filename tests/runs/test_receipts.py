"""Receipts: issued in a chain, signed by the worker and countersigned by the conductor,
written through the real emitter and recorder, and checked by `frlm_receipts verify`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from decimal import Decimal

import pytest
import redis
from django.core.management import CommandError, call_command

from runs.trust.receipts import (
    ReceiptChain,
    chain_verify,
    conductor_key,
    receipt_attrs,
    receipt_hash,
    receipt_worker_sign,
)
from traces.emitter import Emitter, sha256_text
from traces.recorder import Recorder
from workers import keys
from workers.models import Venue, Worker

WORKER_KEYS = {"w1": keys.generate(), "w2": keys.generate()}


@pytest.fixture
def client(stack, settings, tmp_path):
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    settings.FRLM_CONDUCTOR_KEY_FILE = tmp_path / "keys" / "conductor.key"
    url = stack.redis_url.rsplit("/", 1)[0] + "/6"
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    yield conn
    conn.flushdb()


def issue(run_id: str, n: int, chain: ReceiptChain | None = None) -> list[dict]:
    """n receipts of run_id, alternating workers w1 and w2, from one chain."""
    chain = chain or ReceiptChain(run_id)
    made = []
    for i in range(n):
        worker = f"w{i % 2 + 1}"
        key = WORKER_KEYS[worker]
        made.append(
            chain.issue(
                span=f"sq{i}",
                attempt=f"{i + 1}.1",
                worker=worker,
                input_sha256=sha256_text(f"prompt {i}"),
                output_sha256=sha256_text(f"reply {i}"),
                tokens_in=100 + i,
                tokens_out=20,
                price_in=0.00015,
                price_out=0.0006,
                cost=0.1 + i / 1000,
                verdict="accepted",
                worker_sign=lambda receipt, key=key: receipt_worker_sign(receipt, key),
                worker_key=keys.public_b64(key),
                conductor_key=conductor_key(),
            )
        )
    return made


def write(client: redis.Redis, run_id: str, receipts: list[dict]) -> None:
    """The receipts as Receipt.Emit events under a run span, stored by a real recorder."""
    emitter = Emitter(client, run_id)
    with emitter.span("Run.Init") as run:
        for attrs in receipts:
            emitter.instant(
                "Receipt.Emit",
                parent=run.span_id,
                worker_id=attrs["receipt"]["worker"],
                attrs=attrs,
            )
    recorder = Recorder(client)
    recorder.ensure_group()
    while recorder.step():
        pass


def verify(run_id: str, *options: str) -> str:
    out = []

    class Sink:
        def write(self, text: str) -> None:
            out.append(text)

        def flush(self) -> None:
            pass

    try:
        call_command("frlm_receipts", "verify", run_id, *options, stdout=Sink())
    except CommandError as exc:
        return "".join(out) + f"\nCommandError: {exc}"
    return "".join(out)


def test_it_verifies_a_whole_chain_written_through_the_recorder(client, venues):
    chain = ReceiptChain("rOK")
    made = issue("rOK", 5, chain)
    assert [a["receipt"]["seq"] for a in made] == [1, 2, 3, 4, 5]
    assert made[0]["receipt"]["prev"] is None
    assert made[3]["receipt"]["prev"] == made[2]["hash"] == receipt_hash(made[2]["receipt"])
    write(client, "rOK", made)

    text = verify("rOK")
    assert "OK: 5 receipts of run rOK" in text
    assert f"chain hash: {chain.head}" in text
    assert "CommandError" not in text


def test_it_names_a_tampered_receipt(client):
    made = issue("rT", 4)
    tampered = copy.deepcopy(made)
    tampered[2]["receipt"]["cost"] = 0.001  # cheaper after the fact
    write(client, "rT", tampered)

    text = verify("rT")
    assert "BROKEN: receipt 3 of 4 (seq 3, span sq2, worker w1): hash mismatch" in text
    assert "changed after it was issued" in text
    assert "broken at receipt 3: hash mismatch" in text


def test_it_names_a_rehashed_forgery_by_its_worker_signature(client):
    made = issue("rF", 3)
    forged = copy.deepcopy(made)
    forged[1]["receipt"]["tokens_out"] = 9000
    forged[1]["hash"] = receipt_hash(forged[1]["receipt"])
    write(client, "rF", forged)
    assert "receipt 2 of 3 (seq 2, span sq1, worker w2): bad worker signature" in verify("rF")


def test_it_names_a_gap_where_a_receipt_was_removed(client):
    made = issue("rG", 5)
    write(client, "rG", made[:2] + made[3:])
    text = verify("rG")
    assert "BROKEN: receipt 3 of 4 (seq 4, span sq3, worker w2): gap" in text
    assert "receipt 3 missing before receipt 4" in text


def test_it_names_a_receipt_that_comes_twice(client):
    made = issue("rD", 3)
    write(client, "rD", [*made, made[1]])
    text = verify("rD")
    assert "BROKEN: receipt 3 of 4 (seq 2, span sq1, worker w2): duplicate" in text


def test_it_names_a_broken_prev_link(client):
    made = issue("rP", 3)
    # A third receipt signed properly by everyone, but chained to the wrong predecessor.
    receipt = copy.deepcopy(made[2]["receipt"])
    receipt["prev"] = made[0]["hash"]
    key = WORKER_KEYS[receipt["worker"]]
    relinked = receipt_attrs(
        receipt,
        worker_sig=receipt_worker_sign(receipt, key),
        worker_key=keys.public_b64(key),
        conductor_key=conductor_key(),
    )
    write(client, "rP", [*made[:2], relinked])
    text = verify("rP")
    assert "receipt 3 of 3 (seq 3, span sq2, worker w1): broken prev" in text


def test_it_names_a_bad_or_foreign_countersignature(client):
    made = issue("rC", 3)
    swapped = copy.deepcopy(made)
    swapped[1]["conductor_sig"] = made[0]["conductor_sig"]
    write(client, "rC", swapped)
    assert "receipt 2 of 3 (seq 2, span sq1, worker w2): bad countersignature" in verify("rC")

    # Countersigned, consistently, by some other conductor: not this one's key.
    other = keys.generate()
    foreign = []
    for attrs in issue("rC2", 3):
        receipt = attrs["receipt"]
        foreign.append(
            receipt_attrs(
                receipt,
                worker_sig=attrs["worker_sig"],
                worker_key=attrs["worker_key"],
                conductor_key=other,
            )
        )
    write(client, "rC2", foreign)
    assert "receipt 1 of 3 (seq 1, span sq0, worker w1): wrong conductor key" in verify("rC2")
    # Checked elsewhere than on the conductor's machine, against the conductor's key.
    assert "OK: 3 receipts" in verify("rC2", "--conductor-key", keys.public_b64(other))
    assert "--conductor-key: public_key is not the standard base64" in verify(
        "rC2", "--conductor-key", "nope!"
    )


def test_it_names_a_receipt_copied_from_another_run(client):
    write(client, "rR", issue("rOther", 2))
    assert "receipt 1 of 2 (seq 1, span sq0, worker w1): wrong run" in verify("rR")


def test_it_checks_worker_keys_against_the_registry(client, venues):
    venue = Venue.objects.get(name="edge")
    Worker.objects.create(
        id="w2", name="w2", venue=venue, public_key=keys.public_b64(keys.generate())
    )
    write(client, "rW", issue("rW", 3))
    text = verify("rW")
    assert "receipt 2 of 3 (seq 2, span sq1, worker w2): unregistered worker key" in text

    Worker.objects.filter(id="w2").update(public_key=keys.public_b64(WORKER_KEYS["w2"]))
    text = verify("rW")
    assert "OK: 3 receipts" in text
    assert "checked against the registry: 1; not registered here: w1" in text


def test_it_exits_non_zero_and_reports_json(client, subprocess_env, settings):
    write(client, "rJ", issue("rJ", 4)[1:])  # the first receipt is missing
    env = {
        **subprocess_env,
        "FRLM_TRACE_DIR": str(settings.FRLM_TRACE_DIR),
        "FRLM_CONDUCTOR_KEY_FILE": str(settings.FRLM_CONDUCTOR_KEY_FILE),
    }
    args = [sys.executable, "manage.py", "frlm_receipts", "verify", "rJ", "--json"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["count"] == 3
    assert report["broken"]["problem"] == "gap"
    assert report["broken"]["detail"] == "receipt 1 missing before receipt 2"
    assert "broken at receipt 1: gap" in done.stderr

    write(client, "rJ2", issue("rJ2", 2))
    done = subprocess.run(args[:4] + ["rJ2", "--json"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


def test_it_says_when_a_run_has_no_trace(client):
    assert "rNone has no stored trace" in verify("rNone")
    assert "not a run id" in verify("../x")


def test_it_does_not_countersign_or_advance_on_a_bad_worker_signature(settings, tmp_path):
    settings.FRLM_CONDUCTOR_KEY_FILE = tmp_path / "conductor.key"
    chain = ReceiptChain("rX")
    with pytest.raises(ValueError, match="does not verify"):
        chain.issue(
            span="sq0",
            attempt="1.1",
            worker="w1",
            input_sha256="a" * 64,
            output_sha256="b" * 64,
            tokens_in=1,
            tokens_out=1,
            price_in=0.0,
            price_out=0.0,
            cost=0.0,
            verdict="accepted",
            worker_sign=lambda receipt: receipt_worker_sign(receipt, WORKER_KEYS["w2"]),
            worker_key=keys.public_b64(WORKER_KEYS["w1"]),
            conductor_key=conductor_key(),
        )
    assert (chain.seq, chain.head) == (0, None)
    assert settings.FRLM_CONDUCTOR_KEY_FILE.stat().st_mode & 0o077 == 0  # owner only


def test_it_issues_plain_numbers_and_refuses_impossible_ones(settings, tmp_path):
    settings.FRLM_CONDUCTOR_KEY_FILE = tmp_path / "conductor.key"
    chain = ReceiptChain("rN")
    key = WORKER_KEYS["w1"]
    common = {
        "span": "sq0",
        "attempt": "1.1",
        "worker": "w1",
        "input_sha256": "a" * 64,
        "output_sha256": "b" * 64,
        "tokens_out": 1,
        "price_in": 0.001,
        "price_out": 0.002,
        "verdict": "accepted",
        "worker_sign": lambda receipt: receipt_worker_sign(receipt, key),
        "worker_key": keys.public_b64(key),
        "conductor_key": conductor_key(),
    }
    attrs = chain.issue(tokens_in=True, cost=Decimal("0.25"), **common)
    assert attrs["receipt"]["cost"] == 0.25 and type(attrs["receipt"]["cost"]) is float
    assert type(attrs["receipt"]["tokens_in"]) is int
    with pytest.raises(ValueError, match="cost must be finite and 0 or more"):
        chain.issue(tokens_in=1, cost=float("nan"), **common)
    assert chain.seq == 1


def test_it_reports_a_malformed_receipt_instead_of_crashing():
    report = chain_verify("r1", [{"receipt": {"seq": 1}, "hash": "x"}])
    assert report["ok"] is False
    assert report["broken"]["problem"] == "malformed"
    assert "lacks worker_sig" in report["broken"]["detail"]


def test_it_pays_only_replies_not_judged_wrong_and_the_payment_is_countersigned(client):
    chain = ReceiptChain("rPay")
    made = issue("rPay", 2, chain)
    assert made[0]["receipt"]["paid"] == made[0]["receipt"]["cost"]
    key = WORKER_KEYS["w1"]
    rejected = chain.issue(
        span="sq9",
        attempt="9.1",
        worker="w1",
        input_sha256="a" * 64,
        output_sha256="b" * 64,
        tokens_in=5,
        tokens_out=5,
        price_in=0.001,
        price_out=0.002,
        cost=0.5,
        verdict="rejected",
        worker_sign=lambda receipt: receipt_worker_sign(receipt, key),
        worker_key=keys.public_b64(key),
        conductor_key=conductor_key(),
    )
    assert rejected["receipt"]["paid"] == 0.0
    # Paying a rejected reply after the fact is not the worker's claim to change, but the
    # conductor's countersignature no longer covers it.
    forged = copy.deepcopy([*made, rejected])
    forged[2]["receipt"]["paid"] = 0.5
    forged[2]["hash"] = receipt_hash(forged[2]["receipt"])
    write(client, "rPay", forged)
    assert "receipt 3 of 3 (seq 3, span sq9, worker w1): bad countersignature" in verify("rPay")
