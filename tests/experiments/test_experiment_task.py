"""An experiment launched as the console launches it runs on the real conductor: the
Celery task runs the suite (its runs are ordinary runs), reports progress, builds the
report, and the page then shows it."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from runs.experiments.services import experiment_launch
from runs.experiments.suite import load_suite
from runs.models import Experiment, Run
from tests.helpers import wait_until
from tests.pages.helpers import make_user

pytestmark = pytest.mark.timeout(900)

TINY = {
    "name": "tiny",
    "tasks": [{"family": "sniah", "tokens": 8000, "count": 1}],
    "baselines": ["local_only", "fed_redundancy"],
    "seeds": [0],
    "federation": {
        "local": "xt-local",
        "venues": [
            {"name": "xt-local", "workers": 1, "profile": "datacenter", "trusted": True},
            {
                "name": "xt-edge",
                "workers": 2,
                "profile": {"latency": {"median_ms": 40}, "faults": {"lie_share": 0.5}},
            },
        ],
    },
    "policy": {"max_turns": 4},
    "timeout_s": 120,
}


def test_it_runs_a_suite_on_the_conductor_and_shows_its_report(venues, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    suite = load_suite(path)
    ana = make_user("ana")
    experiment = Experiment.objects.create(
        created_by=ana,
        suite_name=suite.name,
        suite=suite.to_dict(),
        total=2,
        output_dir=str(tmp_path / "out"),
    )
    experiment_launch(experiment)  # outside a transaction: enqueued at once
    seen: set[int] = set()

    def ended() -> bool:
        experiment.refresh_from_db()
        seen.add(experiment.done)
        return experiment.ended

    wait_until(ended, timeout=600, every=0.5, what="the experiment to end")
    assert experiment.status == "done", experiment.error
    assert experiment.done == 2 and {1, 2} & seen
    rows = [json.loads(x) for x in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert {r["baseline"] for r in rows} == {"local_only", "fed_redundancy"}
    assert Run.objects.filter(id__in=[r["run_id"] for r in rows]).count() == 2
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [t["key"] for t in report["tables"]] == ["latency", "cost", "success", "detection"]
    client = Client()
    client.force_login(ana)
    page = client.get(reverse("experiment", args=[experiment.pk]))
    assert reverse("experiment-report", args=[experiment.pk]).encode() in page.content
    served = client.get(reverse("experiment-report", args=[experiment.pk]))
    assert b"Table 1. End-to-end latency by baseline" in b"".join(served.streaming_content)
