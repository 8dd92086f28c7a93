"""argparse types of the worker commands' names: a name's form is the option's own to refuse,
in one line with exit 2, as every frlm_* command's options are (frlm_web/commands.py)."""

from __future__ import annotations

import argparse

from django.core.exceptions import ValidationError

from workers.models import venue_name_validator
from workers.services import NAME_RE


def venue_name(text: str) -> str:
    """A venue's name: 1 to 32 lowercase letters, digits, '-' or '_', from a letter."""
    try:
        venue_name_validator(text)
    except ValidationError:
        raise argparse.ArgumentTypeError(
            "takes a venue name: 1 to 32 lowercase letters, digits, '-' or '_', starting with "
            f"a letter, not {text[:100]!r}"
        ) from None
    return text


venue_name.__name__ = "venue name"


def worker_name(text: str) -> str:
    """A worker's name: 1 to 64 letters, digits, '.', '-' or '_', from a letter or digit."""
    if not NAME_RE.match(text):
        raise argparse.ArgumentTypeError(
            "takes 1 to 64 letters, digits, '.', '-' or '_', starting with a letter or digit, "
            f"not {text[:100]!r}"
        )
    return text


worker_name.__name__ = "worker name"
