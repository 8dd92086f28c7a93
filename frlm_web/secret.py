"""The server's SECRET_KEY: FRLM_SECRET_KEY, or else a random key made once and kept in the
data directory (mode 0600), so that a fresh checkout runs with nothing set and no process
ever signs with a constant anyone can read in this repository.

Every process of one installation reads the same file (they share FRLM_DATA_DIR), which
matters beyond sessions: the Redis users' passwords derive from this key
(frlm_web/redis_acl.py). Settings import this module, so it imports nothing of Django.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# The constant earlier versions used when FRLM_SECRET_KEY was unset: public, so never a key.
KNOWN_KEYS = frozenset({"frlm-insecure-development-key-set-FRLM_SECRET_KEY"})

GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"


def stored_key(path: Path) -> str:
    """The key in `path`, made by whichever process of the installation needs it first.
    It is written whole to a private temporary file and hard-linked into place, so a
    process starting alongside reads either no file or the whole key, and all read the
    same one."""
    key = _read(path)
    if key:
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50) + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process made it first: theirs stands
    except OSError as exc:
        raise RuntimeError(
            f"cannot keep a secret key in {path} ({exc}): set FRLM_SECRET_KEY, e.g. to the "
            f"output of {GENERATE}"
        ) from exc
    finally:
        draft.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def refusal(secret_key: str, debug: bool) -> str:
    """Why this key must not serve, or "" when it may: with DEBUG off, a key published in
    this repository would let anyone forge sessions and derive the Redis passwords."""
    if debug or secret_key not in KNOWN_KEYS:
        return ""
    return (
        "FRLM_SECRET_KEY is the development key published in FRLM web's repository, and "
        "DEBUG is off: set FRLM_SECRET_KEY to a long random value, e.g. the output of "
        f"{GENERATE} (or unset it: a random key is then kept in the data directory)"
    )
