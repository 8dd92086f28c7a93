"""Attestations of the high-trust tier: a validator (a worker of a trusted venue) re-runs a
sampled sub-query and signs what it found, so anyone holding its public key can later
check that the sub-query was re-run and whether the two answers agreed.

The validator builds and signs them in the worker task, which imports nothing of runs, so
they are defined in workers.attestation; the names stay importable from here for the
conductor, the fanout and the receipts."""

from __future__ import annotations

from workers.attestation import Attestation as Attestation
from workers.attestation import SignedAttestation as SignedAttestation
from workers.attestation import Verdict as Verdict
from workers.attestation import attestation_build as attestation_build
from workers.attestation import attestation_problem as attestation_problem
from workers.attestation import attestation_sign as attestation_sign
from workers.attestation import utc_now as utc_now
