"""Ed25519 keys and signatures: how workers prove who they are, how results, receipts and
attestations are signed, and how anyone checks them.

Keys travel as base64 of their 32 raw bytes; signatures as base64 of their 64 bytes, each
in its one canonical spelling (standard alphabet, padded, unused bits zero): a lax decoder
reads many spellings of the same bytes, and a replay cache or a key comparison on the
text would tell them apart. What is signed is always canonical JSON (sorted keys, no
spaces, UTF-8), so a signer and a checker in different processes agree on the bytes."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

PUBLIC_KEY_B64_LEN = 44  # base64 of 32 bytes
SIGNATURE_LEN = 64


class BadKey(ValueError):
    """A key is malformed; the message says which and what is expected."""


class BadSignature(ValueError):
    """A signature is not the standard base64 of 64 bytes."""


def _b64_strict(text: str) -> bytes:
    """The bytes `text` is the canonical standard base64 of, or ValueError."""
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("not the canonical base64 of its bytes")
    return raw


def canonical(obj: Any) -> bytes:
    """The one byte form of a JSON value that is signed and hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def generate() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@functools.lru_cache(maxsize=64)
def public_b64(key: Ed25519PrivateKey) -> str:
    """The public half of `key`, as registered (cached: the conductor names its key in every
    receipt it countersigns)."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def private_b64(key: Ed25519PrivateKey) -> str:
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return base64.b64encode(raw).decode("ascii")


def private_from_b64(text: str) -> Ed25519PrivateKey:
    try:
        raw = _b64_strict(text)
    except (binascii.Error, ValueError) as exc:
        raise BadKey("a private key is standard base64 of 32 bytes") from exc
    if len(raw) != 32:
        raise BadKey(f"a private key is 32 bytes, this one is {len(raw)}")
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_from_b64(text: str) -> Ed25519PublicKey:
    """The public key in `text`, or BadKey saying what is wrong with it."""
    if not isinstance(text, str):
        raise BadKey("public_key must be a string: base64 of the 32-byte ed25519 key")
    return _public_key(text)


# The conductor checks every result's signature with its worker's key: loading the key
# each time was 3% of its CPU at 1 ms model latency (issue 18). A key that fails is not
# kept (lru_cache keeps no exception).
@functools.lru_cache(maxsize=4096)
def _public_key(text: str) -> Ed25519PublicKey:
    try:
        raw = _b64_strict(text)
    except (binascii.Error, ValueError) as exc:
        raise BadKey(
            "public_key is not the standard base64 (padded, as base64.b64encode writes it) "
            "of the 32-byte ed25519 key"
        ) from exc
    if len(raw) != 32:
        raise BadKey(f"public_key must decode to 32 bytes (ed25519); it decodes to {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def sign(key: Ed25519PrivateKey, obj: Any) -> str:
    """base64 signature of the canonical JSON of `obj`."""
    return base64.b64encode(key.sign(canonical(obj))).decode("ascii")


def signature_bytes(signature: str) -> bytes:
    """The 64 bytes of a signature in its one canonical spelling, or BadSignature."""
    if not isinstance(signature, str):
        raise BadSignature("a signature is a string")
    try:
        raw = _b64_strict(signature)
    except (binascii.Error, ValueError) as exc:
        raise BadSignature("a signature is the standard base64 of its 64 bytes") from exc
    if len(raw) != SIGNATURE_LEN:
        raise BadSignature(f"a signature is {SIGNATURE_LEN} bytes; this one is {len(raw)}")
    return raw


def verify(public_key: str | Ed25519PublicKey, obj: Any, signature: str) -> bool:
    """True when `signature` (canonical base64) is `public_key`'s signature of `obj`;
    never raises."""
    try:
        pub = public_from_b64(public_key) if isinstance(public_key, str) else public_key
        pub.verify(signature_bytes(signature), canonical(obj))
    except (InvalidSignature, BadKey, BadSignature, ValueError, TypeError):
        return False
    return True


def load_or_create(path: Path) -> Ed25519PrivateKey:
    """The key kept in `path` (base64 raw bytes), made on first use, readable by the owner
    only."""
    if path.exists():
        return private_from_b64(path.read_text().strip())
    path.parent.mkdir(parents=True, exist_ok=True)
    key = generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(private_b64(key) + "\n")
    return key
