"""The experiment pages with Django's test client: sign-in, CSRF, the launcher's checks,
who may see a report, and a hostile answer escaped in it."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from runs.experiments.report import build_report
from runs.models import Experiment
from tests.experiments.conftest import HOSTILE
from tests.pages.helpers import make_user


def _signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_it_sends_anonymous_visitors_to_sign_in():
    experiment = Experiment.objects.create(suite_name="small", output_dir="/nonexistent")
    for url in (
        reverse("experiments"),
        reverse("experiment", args=[experiment.pk]),
        reverse("experiment-progress", args=[experiment.pk]),
        reverse("experiment-report", args=[experiment.pk]),
    ):
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login" in response["Location"], url
    assert Client().post(reverse("experiments"), {"suite": "small"}).status_code == 302
    assert Experiment.objects.count() == 1


@pytest.mark.django_db
def test_it_refuses_a_launch_without_its_csrf_token():
    client = _signed_in(make_user("ops", staff=True), enforce_csrf_checks=True)
    assert client.post(reverse("experiments"), {"suite": "small"}).status_code == 403
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_it_queues_the_suite_and_starts_it_only_after_commit(django_capture_on_commit_callbacks):
    client = _signed_in(make_user("ops", staff=True))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("experiments"), {"suite": "small", "tune": "replicas=2,3"})
    experiment = Experiment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("experiment", args=[experiment.pk])
    assert experiment.status == "queued" and experiment.suite["name"] == "small"
    assert experiment.tune == {"replicas": ["2", "3"]}
    # Every task on each baseline and seed: 2 tasks x 6 baselines x 2 seeds.
    assert experiment.total == 24
    assert experiment.output_dir.endswith(f"experiments/x{experiment.pk}")
    assert len(callbacks) == 1
    page = client.get(reverse("experiment", args=[experiment.pk]))
    assert b"queued" in page.content and b'hx-trigger="every 2s"' in page.content


@pytest.mark.django_db
def test_only_staff_may_start_one_and_see_where_its_data_is(django_capture_on_commit_callbacks):
    """Any signed-in user started suites, which start device swarms and register venues on
    the server, and was shown the server's path to the data (a review)."""
    ana = make_user("ana")
    client = _signed_in(ana)
    page = client.get(reverse("experiments"))
    assert b"Run the suite" not in page.content and b"Only staff may start" in page.content
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("experiments"), {"suite": "default"})
    assert response.status_code == 403 and b"only staff may start an experiment" in response.content
    assert not Experiment.objects.exists() and not callbacks
    mine = Experiment.objects.create(suite_name="small", output_dir="/srv/x1", created_by=ana)
    progress = client.get(reverse("experiment-progress", args=[mine.pk]))
    assert progress.status_code == 200 and b"/srv/x1" not in progress.content


@pytest.mark.django_db
def test_it_says_what_is_wrong_with_a_policy_loop_item():
    client = _signed_in(make_user("ops", staff=True))
    response = client.post(reverse("experiments"), {"suite": "small", "tune": "replicas=two"})
    assert response.status_code == 400
    # The line, not the command's --tune, is named (a review).
    assert b"the line replicas=two" in response.content and b"--tune" not in response.content
    # Two lines for one setting: the first line's values were dropped without a word.
    twice = {"suite": "small", "tune": "hedge=p90,p99\nhedge=off"}
    response = client.post(reverse("experiments"), twice)
    assert response.status_code == 400
    assert b"hedge is given twice (hedge=p90,p99 and hedge=off)" in response.content
    response = client.post(reverse("experiments"), {"suite": "huge"})
    assert response.status_code == 400
    assert not Experiment.objects.exists()


def test_it_serves_the_report_to_its_creator_and_staff_only_with_answers_escaped(
    experiment_dir,
):
    ana, bob, ops = make_user("ana"), make_user("bob"), make_user("ops", staff=True)
    build_report(experiment_dir)
    experiment = Experiment.objects.create(
        created_by=ana,
        suite_name="test",
        output_dir=str(experiment_dir),
        status="done",
        done=10,
        total=10,
        report_path=str(experiment_dir / "report.html"),
    )
    page_url = reverse("experiment", args=[experiment.pk])
    report_url = reverse("experiment-report", args=[experiment.pk])
    for user in (ana, ops):
        client = _signed_in(user)
        page = client.get(page_url)
        assert page.status_code == 200 and report_url.encode() in page.content
        assert b'hx-trigger="every 2s"' not in page.content  # done: no more polling
        report = client.get(report_url)
        assert report.status_code == 200
        assert report["X-Frame-Options"] == "SAMEORIGIN"
        body = b"".join(report.streaming_content).decode()
        assert "Table 4. Detection of lying and colluding workers" in body
        assert HOSTILE not in body
        assert "&lt;script&gt;alert(" in body
    outsider = _signed_in(bob)
    assert outsider.get(page_url).status_code == 404
    assert outsider.get(report_url).status_code == 404
    listing = outsider.get(reverse("experiments"))
    assert page_url.encode() not in listing.content


def test_the_tune_fields_example_is_one_the_form_takes():
    """Its placeholder said hedge=0.9,0.95, which the form refused (a review)."""
    from runs.experiments.tune import parse_tune
    from runs.experiments.views import TUNE_EXAMPLE, ExperimentForm

    assert ExperimentForm().fields["tune"].widget.attrs["placeholder"] == TUNE_EXAMPLE
    assert parse_tune(TUNE_EXAMPLE.splitlines()) == {
        "replicas": ["2", "3"],
        "hedge": ["p90", "p99"],
    }
