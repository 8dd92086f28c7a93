"""Celery's configuration comes from Django's CELERY_* settings, read once into a plain
mapping (frlm_web.celery.CelerySettings)."""

from __future__ import annotations

from django.conf import settings

from frlm_web.celery import CelerySettings, app


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
