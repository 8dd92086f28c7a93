"""Celery's configuration comes from Django's CELERY_* settings, read once into a plain
mapping (frlm_web.celery.CelerySettings)."""

from __future__ import annotations

from django.conf import settings

from frlm_web.celery import CelerySettings, app, monitoring_options
from frlm_web.redis_acl import acl_lines


def test_celery_reads_djangos_celery_settings_under_its_own_names() -> None:
    conf = app.conf
    assert conf.broker_url == settings.CELERY_BROKER_URL
    assert conf.task_routes == settings.CELERY_TASK_ROUTES
    assert conf.task_default_queue == settings.CELERY_TASK_DEFAULT_QUEUE
    assert list(conf.accept_content) == list(settings.CELERY_ACCEPT_CONTENT)
    assert conf.task_ignore_result is True
    assert conf.timezone == settings.TIME_ZONE


def test_settings_left_unset_keep_celerys_defaults() -> None:
    assert app.conf.task_acks_late is False
    assert app.conf.task_protocol == 2


def test_the_mapping_holds_only_the_celery_settings() -> None:
    mapping = CelerySettings()
    names = {name for name in dir(settings) if name.startswith("CELERY_")}
    assert set(mapping) == {name.removeprefix("CELERY_").lower() for name in names} | {"timezone"}
    assert mapping["broker_url"] == settings.CELERY_BROKER_URL
    assert len(mapping) == len(names) + 1


def test_every_task_route_names_a_task_that_exists() -> None:
    app.loader.import_default_modules()
    routes = settings.CELERY_TASK_ROUTES
    assert routes, "a run must be routed to the conductors' queue"
    assert set(routes) <= set(app.tasks), f"routes naming no task: {set(routes) - set(app.tasks)}"
    assert app.amqp.router.route({}, "runs.conduct")["queue"].name == "runs"


def test_it_starts_workers_without_celery_events_unless_asked(settings) -> None:
    settings.FRLM_CELERY_EVENTS = False
    assert monitoring_options() == ["--without-heartbeat"]
    settings.FRLM_CELERY_EVENTS = True
    assert monitoring_options() == ["--task-events"]


def test_it_lets_only_the_task_roles_publish_events_when_they_are_on() -> None:
    def rules(events: bool) -> dict[str, str]:
        lines = acl_lines("k" * 50, events=events)[1:]
        return {line.split()[1]: line for line in lines}

    assert not any("celeryev" in line for line in rules(False).values())
    on = rules(True)
    assert {role for role, line in on.items() if "&/*.celeryev/*" in line} == {
        "web",
        "conductor",
        "worker",
    }


def test_a_worker_does_not_log_that_it_cannot_mark_a_revoked_job_in_a_backend():
    """FRLM has no result backend: each revoked job cost a warning, ~400 lines per cancel."""
    import logging

    from celery.backends.base import DisabledBackend

    from frlm_web.celery import _no_backend_to_mark, app

    try:
        DisabledBackend(app).get_state("t1")  # what a worker's revoke asks first
    except NotImplementedError as exc:
        said = exc
    record = logging.LogRecord(
        "celery.worker.control",
        logging.WARNING,
        __file__,
        1,
        "Failed to mark task %s as revoked in backend: %s",
        ("t1", said),
        None,
    )
    assert not _no_backend_to_mark(record)
    other = logging.LogRecord(
        "celery.worker.control",
        logging.WARNING,
        __file__,
        1,
        "Terminating %s (%s)",
        ("t1", 15),
        None,
    )
    assert _no_backend_to_mark(other)
