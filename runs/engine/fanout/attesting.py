"""Whether a validator's signed attestation of a reply is sound (the high-trust tier): signed
with the validator's registered key, and about this very reply of this run. The judge
(runs/engine/fanout/judging.py) acts on its verdict; a refused one is the validator's
strike."""

from __future__ import annotations

import json
from collections.abc import Callable

from runs.engine.fanout.state import Flight
from traces.emitter import sha256_text
from workers import attestation


def sound_attestation(
    run_id: str,
    flight: Flight,
    judged: Flight,
    copy: Flight,
    public_key: Callable[[str], str | None],
) -> tuple[attestation.SignedAttestation | None, str | None]:
    """The validator's signed attestation (`copy`'s, of `judged`'s reply to the sub-query
    `flight`), and what is wrong with it (None when it is sound)."""
    assert copy.result is not None
    try:
        signed = json.loads(copy.result.get("attestation") or "null")
    except ValueError:
        return None, "not JSON"
    if not isinstance(signed, dict):
        return None, "the validator sent none"
    key = public_key(copy.outcome.worker_id)
    problem = attestation.attestation_problem(signed, validator_key=key)  # type: ignore[arg-type]
    if problem is not None:
        return None, problem
    att = signed["attestation"]
    expected = {
        "run": run_id,
        "subquery": flight.span.span_id,
        "span": judged.span.span_id,
        "worker": judged.outcome.worker_id,
        "validator": copy.outcome.worker_id,
        "input_sha256": sha256_text(judged.prompt),
        "worker_output_sha256": sha256_text(judged.outcome.text),
        "validator_output_sha256": sha256_text(copy.outcome.text),
    }
    wrong = [k for k, v in expected.items() if att.get(k) != v]
    if wrong:
        return None, f"it is not about this reply ({', '.join(wrong)} differ)"
    return signed, None  # type: ignore[return-value]
