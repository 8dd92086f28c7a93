"""Content-addressed blob store: prompts and replies stored once, by sha256."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings


def blob_dir() -> Path:
    return settings.FRLM_TRACE_DIR / "blobs"


def blob_path(ref: str) -> Path:
    return blob_dir() / ref[:2] / ref


def blob_put(ref: str, text: str, *, durable: bool = True) -> None:
    """Store a text once. With durable=False the caller syncs (the recorder syncs a whole
    batch at once)."""
    path = blob_path(ref)
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{ref}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def blob_get(ref: str) -> str | None:
    try:
        return blob_path(ref).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
