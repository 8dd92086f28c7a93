"""`manage.py frlm_broker_url`: the Redis URL an operator gives a trusted venue's worker."""

from __future__ import annotations

from io import StringIO
from urllib.parse import urlsplit

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from workers.reputation import strikes_key


def broker_url(venue: str) -> str:
    out = StringIO()
    call_command("frlm_broker_url", venue=venue, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


def test_it_prints_a_url_that_connects_as_the_worker_role(stack, venues) -> None:
    url = broker_url("local")  # `local` is trusted
    assert urlsplit(url).username == "worker"
    client = redis.Redis.from_url(url)
    assert client.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.delete(strikes_key("w1"))


def test_it_refuses_an_untrusted_venue(stack, venues) -> None:
    with pytest.raises(CommandError, match="venue 'edge' is not trusted"):
        broker_url("edge")


def test_it_refuses_an_unknown_venue(stack, venues) -> None:
    with pytest.raises(CommandError, match="no venue 'nowhere'"):
        broker_url("nowhere")
