from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path

from frlm_web import accounts, vendor
from runs.selectors import recent_run_ids, run_started_bounds, run_visible
from traces import views as trace_views
from workers import api as worker_api
from workers import views as worker_views

# The trace API is told who may read a run by the runs app (traces imports nothing of it).
access = {"access": run_visible}
# The worker pages are told which runs the user may see and when they ran by the same app
# (workers imports nothing of it either).
run_reads = {
    "run_reads": worker_views.RunReads(recent_ids=recent_run_ids, started_bounds=run_started_bounds)
}

urlpatterns = [
    # Both sign-in forms count failures and refuse past the limit (frlm_web/accounts.py).
    path("admin/login/", accounts.throttled_sign_in(admin.site.login)),
    path("admin/", admin.site.urls),
    path("accounts/login/", accounts.login, name="login"),
    # Django's auth views but its reset-by-mail ones: no mail is set up, and its pages
    # said a mail had been sent (a review). A password is changed signed in, or with
    # `manage.py changepassword`.
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password_change/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("", include("runs.urls")),
    # What a browser asks for by itself on a page that names no icon (the admin's): a 404
    # on every admin page's console (a review).
    path("favicon.ico", lambda _request: redirect(static("favicon.svg"), permanent=True)),
    path("venues", worker_views.venues_page, run_reads, name="venues"),
    path("venues/panel", worker_views.venues_panel, run_reads, name="venues-panel"),
    path("venues/history", worker_views.venues_history, run_reads, name="venues-history"),
    path("workers/<str:worker_id>", worker_views.worker_page, run_reads, name="worker"),
    path("api/runs/<str:run_id>/events", trace_views.run_events, access, name="api-events"),
    path(
        "api/runs/<str:run_id>/spans/<str:span_id>",
        trace_views.span_detail,
        access,
        name="api-span",
    ),
    path("api/runs/<str:run_id>/turns", trace_views.run_turns, access, name="api-turns"),
    path(
        "api/runs/<str:run_id>/aggregates",
        trace_views.run_aggregates,
        access,
        name="api-aggregates",
    ),
    path("api/diff", trace_views.diff_json, access, name="api-diff"),
    # The worker registration API: machine clients, token or signature, no session.
    path("api/worker-names", worker_views.worker_names_json, name="api-worker-names"),
    path("api/workers/register", worker_api.register, name="api-worker-register"),
    path(
        "api/workers/<str:worker_id>/heartbeat",
        worker_api.heartbeat,
        name="api-worker-heartbeat",
    ),
    path(
        "api/workers/<str:worker_id>/deregister",
        worker_api.deregister,
        name="api-worker-deregister",
    ),
    path("api/openapi.json", worker_api.openapi, name="api-openapi"),
    path(f"vendor/{vendor.PLOTLY_FILE}", vendor.plotly_js, name="plotly-js"),
]
