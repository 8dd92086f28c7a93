"""Attestations of the high-trust tier: a validator (a worker of a trusted venue) re-runs a
sampled sub-query and signs what it found, so anyone holding its public key can later
check that the sub-query was re-run and whether the two answers agreed.

The texts themselves are not in an attestation, only their sha256 (the trace's blob store
keeps the texts under the same hashes).

A validator worker builds and signs these (workers.tasks), and the conductor checks them
(runs.engine.fanout.judging), so they live in the workers app, which imports nothing of
runs."""

from __future__ import annotations

import datetime as dt
from typing import Literal, TypedDict

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from traces.emitter import sha256_text
from workers import keys
from workers.agreement import AgreementRule, agree

Verdict = Literal["agree", "diverge"]
_FIELDS = (
    "run",
    "span",
    "subquery",
    "worker",
    "validator",
    "input_sha256",
    "worker_output_sha256",
    "validator_output_sha256",
    "verdict",
    "time",
)


class Attestation(TypedDict):
    run: str
    span: str  # the span of the judged reply
    subquery: str  # the sub-query's own id (its SubQuery.Submit span)
    worker: str  # the worker judged
    validator: str  # the worker that re-ran it
    input_sha256: str
    worker_output_sha256: str
    validator_output_sha256: str
    verdict: Verdict
    time: str  # ISO 8601, UTC


class SignedAttestation(TypedDict):
    """What a Verify.Attest event carries in its attrs."""

    attestation: Attestation
    validator_key: str  # base64 ed25519 public key
    signature: str  # base64, over the canonical JSON of `attestation`


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def attestation_build(
    *,
    run_id: str,
    span_id: str,
    subquery_id: str,
    worker_id: str,
    validator_id: str,
    prompt: str,
    worker_output: str,
    validator_output: str,
    rule: AgreementRule,
    time: str | None = None,
) -> Attestation:
    """The attestation of one re-run: the verdict is whether the two outputs agree under
    `rule` (the same rule the redundant tier uses)."""
    if worker_id == validator_id:
        raise ValueError("a worker cannot validate its own result: choose another validator")
    return {
        "run": run_id,
        "span": span_id,
        "subquery": subquery_id,
        "worker": worker_id,
        "validator": validator_id,
        "input_sha256": sha256_text(prompt),
        "worker_output_sha256": sha256_text(worker_output),
        "validator_output_sha256": sha256_text(validator_output),
        "verdict": "agree" if agree(worker_output, validator_output, rule) else "diverge",
        "time": time or utc_now(),
    }


def attestation_sign(attestation: Attestation, key: Ed25519PrivateKey) -> SignedAttestation:
    """The validator's signature over the attestation, with its public key."""
    return {
        "attestation": attestation,
        "validator_key": keys.public_b64(key),
        "signature": keys.sign(key, attestation),
    }


def attestation_problem(
    signed: SignedAttestation, *, validator_key: str | None = None
) -> str | None:
    """None when `signed` is a well-formed attestation with a good signature (by
    `validator_key` when given: the key registered for the validator), else what is wrong."""
    att = signed.get("attestation") if isinstance(signed, dict) else None
    if not isinstance(att, dict):
        return "not an attestation: no 'attestation' object"
    missing = [f for f in _FIELDS if f not in att]
    if missing:
        return f"attestation lacks {', '.join(missing)}"
    extra = sorted(set(att) - set(_FIELDS))
    if extra:
        return f"attestation has unknown field(s) {', '.join(extra)}"
    if att["verdict"] not in ("agree", "diverge"):
        return f"verdict must be agree or diverge, not {att['verdict']!r}"
    if validator_key is not None and signed.get("validator_key") != validator_key:
        return f"signed with a key that is not validator {att['validator']}'s registered key"
    if not keys.verify(signed.get("validator_key", ""), att, signed.get("signature", "")):
        return "bad signature: the attestation was altered or not signed by its validator_key"
    return None
