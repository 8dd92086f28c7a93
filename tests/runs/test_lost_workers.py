"""A worker lost mid-run is named by the run's page and summary (the trace had Worker.Lost,
but a user reading the run saw nothing of it: a review). The loss itself, end to end, is in
tests/workers/test_failover_delivery.py."""

from __future__ import annotations

import pytest
from django.test import Client

from runs.cli import format_summary, summarise
from runs.models import Run
from tests.helpers import bare_run
from tests.pages.helpers import make_user


@pytest.mark.django_db
def test_the_page_and_the_summary_name_the_workers_a_run_lost():
    owner = make_user("lost-reader")
    lost = [
        {"worker_id": "w-<b>1</b>", "venue": "edge", "held": 3},
        {"worker_id": "w-2", "venue": "local", "held": 1},
    ]
    run = bare_run(
        owner=owner,
        status=Run.Status.SUCCEEDED,
        venues=["local", "edge"],
        accounts={"hedges": 0, "lost": lost},
    )
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.id}").content.decode()
    assert 'id="run-lost"' in page
    # A worker names itself: what it wrote is escaped.
    assert "w-&lt;b&gt;1&lt;/b&gt; of venue edge left while it held 3 attempts" in page
    assert "<b>1</b>" not in page
    assert "worker w-2 of venue local left while it held 1 attempt; it was tried again" in page
    printed = format_summary(summarise(run))
    assert (
        "lost       worker w-<b>1</b> of venue edge left while it held 3 attempts; each was "
        "tried again while tries and workers remained"
    ) in printed
    assert summarise(run)["accounts"]["lost"] == lost


@pytest.mark.django_db
def test_a_run_that_lost_none_or_whose_record_is_odd_says_nothing_of_it():
    owner = make_user("lost-reader")
    client = Client()
    client.force_login(owner)
    for accounts in ({}, {"lost": []}, {"lost": "garbage"}, {"lost": [1, None]}):
        run = bare_run(owner=owner, status=Run.Status.SUCCEEDED, accounts=accounts)
        assert run.lost_workers == []
        assert 'id="run-lost"' not in client.get(f"/runs/{run.id}").content.decode()
        assert "lost  " not in format_summary(summarise(run))
