"""Receipts: issued in a chain, signed by the worker and countersigned by the conductor,
written through the real emitter and recorder, and checked by `frlm_receipts verify`."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
import threading
from decimal import Decimal

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command

from frlm_web.money import money, money_str
from runs.engine.policy import Policy
from runs.models import Run
from runs.trust.accounts import Payee, RunAccounts
from runs.trust.budget import Price
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
def client(stack, venues, settings, tmp_path):
    """Redis for the trace, and workers w1 and w2 registered with their keys."""
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    settings.FRLM_CONDUCTOR_KEY_FILE = tmp_path / "keys" / "conductor.key"
    edge = Venue.objects.get(name="edge")
    for worker, key in WORKER_KEYS.items():
        Worker.objects.create(id=worker, name=worker, venue=edge, public_key=keys.public_b64(key))
    url = stack.redis_url.rsplit("/", 1)[0] + "/6"
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    yield conn
    conn.flushdb()


def issue(
    run_id: str,
    n: int,
    chain: ReceiptChain | None = None,
    *,
    conductor: Ed25519PrivateKey | None = None,
    worker_keys: dict[str, Ed25519PrivateKey] = WORKER_KEYS,
) -> list[dict]:
    """n receipts of run_id, alternating the first two workers of `worker_keys`, from one
    chain, countersigned by `conductor` (default: this machine's key file's)."""
    chain = chain or ReceiptChain(run_id)
    names = sorted(worker_keys)
    made = []
    for i in range(n):
        worker = names[i % 2]
        key = worker_keys[worker]
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
                conductor_key=conductor or conductor_key(),
            )
        )
    return made


def record(run_id: str, issued: list[dict], *, status: str = Run.Status.SUCCEEDED) -> None:
    """The run's row as its conductor leaves it: the count and hash of the chain it issued
    (runs.trust.accounts.ReceiptSummary)."""
    Run.objects.create(
        id=run_id,
        question="q",
        context_source=Run.Source.TEXT,
        context_path="",
        root_model={},
        worker_model={},
        status=status,
        accounts={
            "receipts": {
                "count": len(issued),
                "paid": money_str(sum(money(a["receipt"]["paid"]) for a in issued)),
                "cost": money_str(sum(money(a["receipt"]["cost"]) for a in issued)),
                "verdicts": {"accepted": len(issued)},
                "head": issued[-1]["hash"] if issued else None,
            }
        },
    )


def recountersigned(issued: list[dict], conductor: Ed25519PrivateKey) -> list[dict]:
    """The same receipts and worker signatures, countersigned by another conductor."""
    return [
        receipt_attrs(
            attrs["receipt"],
            worker_sig=attrs["worker_sig"],
            worker_key=attrs["worker_key"],
            conductor_key=conductor,
        )
        for attrs in issued
    ]


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


def receipts_command(*args: str) -> str:
    """What `frlm_receipts ARGS` prints, and its error last."""
    out = io.StringIO()
    try:
        call_command("frlm_receipts", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue() + f"\nCommandError: {exc}"
    return out.getvalue()


def verify(run_id: str, *options: str) -> str:
    return receipts_command("verify", run_id, *options)


def test_it_verifies_a_whole_chain_written_through_the_recorder(client, venues):
    chain = ReceiptChain("rOK")
    made = issue("rOK", 5, chain)
    assert [a["receipt"]["seq"] for a in made] == [1, 2, 3, 4, 5]
    assert made[0]["receipt"]["prev"] is None
    assert made[3]["receipt"]["prev"] == made[2]["hash"] == receipt_hash(made[2]["receipt"])
    record("rOK", made)
    write(client, "rOK", made)

    text = verify("rOK")
    assert "OK: 5 receipts of run rOK" in text
    assert f"chain hash: {chain.head}" in text
    assert "CommandError" not in text


def test_it_names_a_tampered_receipt(client):
    made = issue("rT", 4)
    tampered = copy.deepcopy(made)
    tampered[2]["receipt"]["cost"] = "0.001"  # cheaper after the fact
    record("rT", made)
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
    record("rF", made)
    write(client, "rF", forged)
    assert "receipt 2 of 3 (seq 2, span sq1, worker w2): bad worker signature" in verify("rF")


def test_it_names_a_gap_where_a_receipt_was_removed(client):
    made = issue("rG", 5)
    record("rG", made)
    write(client, "rG", made[:2] + made[3:])
    text = verify("rG")
    assert "BROKEN: receipt 3 of 4 (seq 4, span sq3, worker w2): gap" in text
    assert "receipt 3 missing before receipt 4" in text


def test_it_names_a_receipt_that_comes_twice(client):
    made = issue("rD", 3)
    record("rD", made)
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
    record("rP", made)
    write(client, "rP", [*made[:2], relinked])
    text = verify("rP")
    assert "receipt 3 of 3 (seq 3, span sq2, worker w1): broken prev" in text


def test_it_names_a_bad_or_foreign_countersignature(client):
    made = issue("rC", 3)
    swapped = copy.deepcopy(made)
    swapped[1]["conductor_sig"] = made[0]["conductor_sig"]
    record("rC", made)
    write(client, "rC", swapped)
    assert "receipt 2 of 3 (seq 2, span sq1, worker w2): bad countersignature" in verify("rC")

    # Countersigned, consistently, by some other conductor: not this one's key.
    other = keys.generate()
    genuine = issue("rC2", 3)
    record("rC2", genuine)
    write(client, "rC2", recountersigned(genuine, other))
    assert "receipt 1 of 3 (seq 1, span sq0, worker w1): wrong conductor key" in verify("rC2")
    # Checked elsewhere than on the conductor's machine, against the conductor's key.
    assert "OK: 3 receipts" in verify("rC2", "--conductor-key", keys.public_b64(other))
    assert "--conductor-key: public_key is not the standard base64" in verify(
        "rC2", "--conductor-key", "nope!"
    )


def test_it_names_a_receipt_copied_from_another_run(client):
    copied = issue("rOther", 2)
    record("rR", copied)
    write(client, "rR", copied)
    assert "receipt 1 of 2 (seq 1, span sq0, worker w1): wrong run" in verify("rR")


def test_it_names_a_worker_the_registry_does_not_know(client):
    # Its key was never issued here: its signature proves only that someone signed.
    strangers = {"w1": WORKER_KEYS["w1"], "w9": keys.generate()}
    made = issue("rU", 3, worker_keys=strangers)
    record("rU", made)
    write(client, "rU", made)
    text = verify("rU")
    assert "BROKEN: receipt 2 of 3 (seq 2, span sq1, worker w9): unknown worker" in text
    assert "worker w9 is not in the registry" in text
    assert "checked against the registry: 1; not registered here: w9" in text
    assert "broken at receipt 2: unknown worker" in text


def test_it_names_a_worker_key_other_than_the_registered_one(client):
    # w2's name on work signed with another key, and countersigned all the same.
    impostor = {"w1": WORKER_KEYS["w1"], "w2": keys.generate()}
    made = issue("rS", 3, worker_keys=impostor)
    record("rS", made)
    write(client, "rS", made)
    text = verify("rS")
    assert "BROKEN: receipt 2 of 3 (seq 2, span sq1, worker w2): unregistered worker key" in text


# --- the chain the run recorded, and the conductor's key -----------------------------------


def test_it_names_the_last_receipt_dropped_from_the_trace(client):
    made = issue("rTail", 4)
    record("rTail", made)
    write(client, "rTail", made[:3])
    text = verify("rTail")
    assert "BROKEN: missing receipts: the trace holds 3 of the 4 the run recorded" in text
    assert "receipt 4 is missing at the end" in text
    assert "broken at receipt 4: missing receipts" in text
    assert not text.startswith("OK")


def test_it_names_a_chain_whose_receipts_were_all_dropped(client):
    made = issue("rGone", 3)
    record("rGone", made)
    write(client, "rGone", [])
    text = verify("rGone")
    assert "BROKEN: missing receipts: the trace holds 0 of the 3 the run recorded" in text
    assert "receipts 1 to 3 are missing at the end" in text
    assert "broken at receipt 1: missing receipts" in text


def test_it_names_a_receipt_appended_after_the_run_recorded_its_chain(client):
    made = issue("rExtra", 4)
    record("rExtra", made[:3])  # the run ended with 3; a fourth, well signed, came after
    write(client, "rExtra", made)
    text = verify("rExtra")
    assert "BROKEN: receipt 4 of 4 (seq 4, span sq3, worker w2): extra receipt" in text
    assert "the run recorded 3 receipts" in text
    assert "broken at receipt 4: extra receipt" in text


def test_it_names_a_chain_that_ends_elsewhere_than_the_run_recorded(client):
    made = issue("rHead", 3)
    other = issue("rHead", 3)  # as many receipts, issued again at another time
    record("rHead", made)
    write(client, "rHead", other)
    text = verify("rHead")
    assert "BROKEN: receipt 3 of 3 (seq 3, span sq2, worker w1): chain hash mismatch" in text


def test_it_refuses_a_forged_chain_when_no_conductor_key_is_pinned(
    client, subprocess_env, settings
):
    # A wholly forged chain, its own conductor and workers: with no key to pin, it would
    # vouch for itself. The conductor that ran it keeps its key on another machine.
    genuine = issue("rNoKey", 3, conductor=keys.generate())
    forgers = {"f1": keys.generate(), "f2": keys.generate()}
    forged = issue("rNoKey", 3, conductor=keys.generate(), worker_keys=forgers)
    record("rNoKey", genuine)
    write(client, "rNoKey", forged)
    env = {
        **subprocess_env,
        "FRLM_TRACE_DIR": str(settings.FRLM_TRACE_DIR),
        "FRLM_CONDUCTOR_KEY_FILE": str(settings.FRLM_CONDUCTOR_KEY_FILE),
    }
    args = [sys.executable, "manage.py", "frlm_receipts", "verify", "rNoKey", "--json"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout
    assert done.stdout == ""
    assert "no conductor key to check run rNoKey's receipts against" in done.stderr
    assert "--conductor-key" in done.stderr and "frlm_receipts key" in done.stderr
    assert not settings.FRLM_CONDUCTOR_KEY_FILE.exists()  # a checker makes no key


def test_it_names_a_chain_countersigned_by_another_conductor(client, settings):
    real, other = keys.generate(), keys.generate()
    record("rOC", issue("rOC", 3, conductor=real))
    # Issued again, worker signatures and all, under another conductor's key.
    write(client, "rOC", issue("rOC", 3, conductor=other))
    assert "no conductor key to check" in verify("rOC")

    text = verify("rOC", "--conductor-key", keys.public_b64(real))
    assert "BROKEN: receipt 1 of 3 (seq 1, span sq0, worker w1): wrong conductor key" in text
    assert f"conductor key: {keys.public_b64(real)} (given with --conductor-key)" in text

    settings.FRLM_CONDUCTOR_KEY_FILE.parent.mkdir(parents=True)
    settings.FRLM_CONDUCTOR_KEY_FILE.write_text(keys.private_b64(real) + "\n")
    text = verify("rOC")
    assert "receipt 1 of 3 (seq 1, span sq0, worker w1): wrong conductor key" in text
    assert f"conductor key: {keys.public_b64(real)} (this server's key file)" in text


def test_it_refuses_a_run_that_recorded_no_chain_to_compare(client):
    made = issue("rLive", 2)
    write(client, "rLive", made)
    assert "run rLive is not in this server's database" in verify("rLive")
    record("rLive", made)
    Run.objects.filter(id="rLive").update(status=Run.Status.RUNNING, accounts={})
    assert "run rLive is still running" in verify("rLive")
    Run.objects.filter(id="rLive").update(status=Run.Status.FAILED)
    text = verify("rLive")
    assert "run rLive recorded no count and hash of its receipt chain" in text
    assert not text.startswith("OK")


def test_it_prints_the_conductors_public_key(client, settings):
    assert "no conductor key file" in receipts_command("key")
    key = conductor_key()
    assert receipts_command("key").strip() == keys.public_b64(key)


def test_it_exits_non_zero_and_reports_json(client, subprocess_env, settings):
    made = issue("rJ", 4)
    record("rJ", made)
    write(client, "rJ", made[1:])  # the first receipt is missing
    env = {
        **subprocess_env,
        "FRLM_TRACE_DIR": str(settings.FRLM_TRACE_DIR),
        "FRLM_CONDUCTOR_KEY_FILE": str(settings.FRLM_CONDUCTOR_KEY_FILE),
    }
    args = [sys.executable, "manage.py", "frlm_receipts", "verify", "rJ", "--json"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3  # broken: not 2, a usage error
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["count"] == 3
    assert report["broken"]["problem"] == "gap"
    assert report["broken"]["detail"] == "receipt 1 missing before receipt 2"
    assert report["recorded"] == {"count": 4, "head": made[-1]["hash"]}
    assert "broken at receipt 1: gap" in done.stderr

    made = issue("rJ2", 2)
    record("rJ2", made)
    write(client, "rJ2", made)
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
    attrs = chain.issue(tokens_in=True, cost=Decimal("0.250"), **common)
    # Exact dollars in their one spelling: what is signed is what the trace keeps.
    assert attrs["receipt"]["cost"] == "0.25" and attrs["receipt"]["paid"] == "0.25"
    assert attrs["receipt"]["price"] == {"per_1k_in": "0.001", "per_1k_out": "0.002"}
    assert type(attrs["receipt"]["tokens_in"]) is int
    with pytest.raises(ValueError, match="cost must be finite and 0 or more"):
        chain.issue(tokens_in=1, cost=float("nan"), **common)
    assert chain.seq == 1


def test_it_reports_a_malformed_receipt_instead_of_crashing():
    report = chain_verify(
        "r1",
        [{"receipt": {"seq": 1}, "hash": "x"}],
        recorded={"count": 1, "head": "x"},
        worker_keys={},
        conductor_key=keys.public_b64(keys.generate()),
    )
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
    assert rejected["receipt"]["paid"] == "0"
    # Paying a rejected reply after the fact is not the worker's claim to change, but the
    # conductor's countersignature no longer covers it.
    forged = copy.deepcopy([*made, rejected])
    forged[2]["receipt"]["paid"] = "0.5"
    forged[2]["hash"] = receipt_hash(forged[2]["receipt"])
    record("rPay", [*made, rejected])
    write(client, "rPay", forged)
    assert "receipt 3 of 3 (seq 3, span sq9, worker w1): bad countersignature" in verify("rPay")


def test_it_records_the_chain_hash_of_the_last_receipt_issued_whatever_emits_last(
    settings, tmp_path
):
    # Two sub-queries receipted at once: the first one's event is slow to go out, so the
    # second's lands first. The run must still record the chain's end, or a whole chain
    # would fail its check against the run.
    settings.FRLM_CONDUCTOR_KEY_FILE = tmp_path / "conductor.key"
    first_out, second_done = threading.Event(), threading.Event()

    class SlowFirstEmitter:
        def instant(self, name: str, **fields: object) -> None:
            if fields["attrs"]["receipt"]["seq"] == 1:
                first_out.set()
                second_done.wait(10)

    accounts = RunAccounts("rRace", Policy.from_dict({}), SlowFirstEmitter())

    def receipt(i: int) -> None:
        key = WORKER_KEYS["w1"]
        claim = {
            "run_id": "rRace",
            "sq_id": f"{i}.1",
            "worker_id": "w1",
            "status": "ok",
            "text_sha256": sha256_text(f"reply {i}"),
            "tokens_in": 10,
            "tokens_out": 2,
        }
        payee = Payee(
            span=f"sq{i}",
            attempt=f"{i}.1",
            worker_id="w1",
            worker_key=keys.public_b64(key),
            prompt=f"prompt {i}",
            text=f"reply {i}",
            tokens_in=10,
            tokens_out=2,
            cost=0.01,
            price=Price(0.001, 0.002),
            sig=keys.sign(key, claim),
        )
        accounts.receipt(payee, "accepted", depth=1)

    slow = threading.Thread(target=receipt, args=(1,))
    slow.start()
    assert first_out.wait(10)
    receipt(2)
    second_done.set()
    slow.join(10)
    summary = accounts.figures({}, 0, [])["receipts"]
    assert (summary["count"], summary["head"]) == (2, accounts.chain.head)


def legacy(issued: list[dict]) -> list[dict]:
    """The same work as receipts issued before money was exact: amounts as JSON numbers,
    chained and countersigned as that conductor did."""
    out, prev = [], None
    for attrs in issued:
        receipt = copy.deepcopy(attrs["receipt"])
        receipt["price"] = {k: float(v) for k, v in receipt["price"].items()}
        receipt["cost"], receipt["paid"] = float(receipt["cost"]), float(receipt["paid"])
        receipt["prev"] = prev
        made = receipt_attrs(
            receipt,
            worker_sig=attrs["worker_sig"],
            worker_key=attrs["worker_key"],
            conductor_key=conductor_key(),
        )
        out.append(made)
        prev = made["hash"]
    return out


def test_it_still_verifies_receipts_issued_with_float_amounts(client, venues):
    old = legacy(issue("rOld", 3))
    assert old[0]["receipt"]["cost"] == 0.1 and type(old[0]["receipt"]["cost"]) is float
    record("rOld", old)
    write(client, "rOld", old)
    assert verify("rOld").startswith("OK: 3 receipts of run rOld")


def test_it_refuses_a_receipt_whose_amounts_are_not_plain_decimals(client, venues):
    made = issue("rMix", 2)
    for bad in ("1e-3", "0.10", "-1", "NaN"):
        forged = copy.deepcopy(made)
        forged[1]["receipt"]["cost"] = bad
        report = chain_verify(
            "rMix",
            forged,
            recorded={"count": 2, "head": made[1]["hash"]},
            worker_keys={w: keys.public_b64(k) for w, k in WORKER_KEYS.items()},
            conductor_key=keys.public_b64(conductor_key()),
        )
        assert report["broken"]["problem"] == "malformed", bad
        assert "receipt cost is not an amount of dollars" in report["broken"]["detail"]
    mixed = copy.deepcopy(made)
    mixed[0]["receipt"]["paid"] = 0.1
    report = chain_verify(
        "rMix",
        mixed,
        recorded={"count": 2, "head": made[1]["hash"]},
        worker_keys={w: keys.public_b64(k) for w, k in WORKER_KEYS.items()},
        conductor_key=keys.public_b64(conductor_key()),
    )
    assert report["broken"]["detail"] == "receipt amounts mix decimal strings and numbers"
