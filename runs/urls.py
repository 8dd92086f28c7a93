from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView

from runs import views
from runs.experiments import views as experiment_views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    # The run list is the dashboard; /runs/ is where one looks for it (a run is /runs/<id>).
    path("runs/", RedirectView.as_view(pattern_name="dashboard", query_string=True)),
    path("runs/table", views.runs_table, name="runs-table"),
    path("runs/new", views.run_new, name="run-new"),
    path("runs/<str:run_id>", views.run_page, name="run"),
    path("runs/<str:run_id>/header", views.run_header, name="run-header"),
    path("runs/<str:run_id>/replay", views.run_replay_view, name="run-replay"),
    path("runs/<str:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("diff", views.diff_page, name="diff"),
    path("experiments/", experiment_views.experiments_page, name="experiments"),
    path("experiments/<int:experiment_id>/", experiment_views.experiment_page, name="experiment"),
    path(
        "experiments/<int:experiment_id>/progress",
        experiment_views.experiment_progress,
        name="experiment-progress",
    ),
    path(
        "experiments/<int:experiment_id>/report.html",
        experiment_views.experiment_report,
        name="experiment-report",
    ),
]
