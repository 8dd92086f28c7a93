"""The console's experiment pages: the list with its launcher, one experiment's progress
and then its report (served only to users who may see the experiment)."""

from __future__ import annotations

from pathlib import Path

from django import forms
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.clickjacking import xframe_options_sameorigin
from django.views.decorators.http import require_GET

from runs.experiments.services import SUITES, experiment_create, experiment_launch
from runs.models import Experiment
from runs.selectors import visible_experiments

SHOWN = 50
# The tune field's example: values parse_tune takes (the example was hedge=0.9,0.95, which
# the form refused, a review).
TUNE_EXAMPLE = "replicas=2,3\nhedge=p90,p99"


class ExperimentForm(forms.Form):
    suite = forms.ChoiceField(choices=[(s, s) for s in SUITES], initial="small")
    tune = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": TUNE_EXAMPLE}),
        help_text="optional policy loop: one KEY=v1,v2,... a line",
    )

    def tune_items(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["tune"].splitlines() if line.strip()]


def _get_experiment_for_user(request: HttpRequest, experiment_id: int) -> Experiment:
    """The experiment, or 404 alike for one that does not exist and one the user may not see."""
    return get_object_or_404(visible_experiments(request.user), pk=experiment_id)


# A suite starts device swarms on this server and registers its venues: an operator's act,
# not any signed-in user's (a review).
STAFF_ONLY = (
    "only staff may start an experiment: a suite starts device swarms and registers venues "
    "on this server; ask an operator, or run `manage.py frlm_experiment` on the server"
)


@login_required
def experiments_page(request: HttpRequest) -> HttpResponse:
    """GET: the experiments and, for staff, the launcher. POST (staff): create and start
    one, go to its page."""
    form = ExperimentForm(request.POST or None)
    if request.method == "POST" and not request.user.is_staff:
        ctx = {"form": form, "experiments": visible_experiments(request.user)[:SHOWN]}
        ctx["refused"] = STAFF_ONLY
        return render(request, "experiments/list.html", ctx, status=403)
    if request.method == "POST" and form.is_valid():
        try:
            with transaction.atomic():
                experiment = experiment_create(
                    suite_name=form.cleaned_data["suite"],
                    tune=form.tune_items(),
                    option="the line",
                    user=request.user,
                )
                experiment_launch(experiment)
        except ValueError as exc:
            form.add_error("tune", str(exc))
        else:
            return redirect("experiment", experiment_id=experiment.pk)
    ctx = {"form": form, "experiments": visible_experiments(request.user)[:SHOWN]}
    return render(request, "experiments/list.html", ctx, status=400 if form.errors else 200)


@login_required
@require_GET
def experiment_page(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _get_experiment_for_user(request, experiment_id)
    return render(request, "experiments/experiment.html", {"experiment": experiment})


@login_required
@require_GET
def experiment_progress(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The progress block the page polls while the suite runs (htmx)."""
    experiment = _get_experiment_for_user(request, experiment_id)
    return render(request, "experiments/_progress.html", {"experiment": experiment})


@login_required
@require_GET
@xframe_options_sameorigin
def experiment_report(request: HttpRequest, experiment_id: int) -> FileResponse:
    """The self-contained report.html, framed by the experiment's page."""
    experiment = _get_experiment_for_user(request, experiment_id)
    path = Path(experiment.output_dir) / "report.html"
    if not experiment.output_dir or not path.is_file():
        raise Http404("this experiment has no report yet")
    return FileResponse(path.open("rb"), content_type="text/html; charset=utf-8")
