"""The experiment page in a real browser: the report framed in it draws all four figures
from its inlined Plotly, offline, without a JavaScript error, and a model's hostile answer
stays text."""

from __future__ import annotations

import pytest

from runs.experiments.report import build_report
from runs.models import Experiment

# The pages' browser is package-scoped: this test lives here so that it shares it (a second
# package's copy would start Playwright again inside the first one's loop, and every later
# page test fails with "Playwright Sync API inside the asyncio loop").
from tests.experiments.conftest import HOSTILE, experiment_dir  # noqa: F401  (a fixture)
from tests.pages.helpers import SHOTS

pytestmark = pytest.mark.timeout(900)


def test_it_frames_a_report_whose_four_figures_draw_offline(experiment_dir, page):  # noqa: F811
    build_report(experiment_dir)
    experiment = Experiment.objects.create(
        suite_name="test", output_dir=str(experiment_dir), status="done", done=10, total=10
    )
    # Nothing may come from the network: the report is one self-contained file.
    requested: list[str] = []
    dialogs: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    # The frame parses some 5 MB (Plotly inlined): give it time on a busy machine.
    page.goto(f"/experiments/{experiment.pk}/", wait_until="domcontentloaded", timeout=120_000)
    frame = page.frame_locator("iframe.report-frame")
    frame.locator("#fig-diff .main-svg").first.wait_for(timeout=180_000)
    for key in ("rail", "budget", "routing", "diff"):
        assert frame.locator(f"#fig-{key} .main-svg").count() >= 1, key
    assert frame.locator("table[data-table=latency] tbody tr").count() == 5
    answers = frame.locator("table[data-table=runs]").inner_text()
    assert HOSTILE in answers and not dialogs  # shown as the text it is, never run
    assert not [u for u in requested if not u.startswith(page.url.split("/experiments")[0])]
    page.screenshot(path=str(SHOTS / "experiment-report.png"), full_page=True)
