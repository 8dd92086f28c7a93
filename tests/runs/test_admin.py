"""The Django admin's runs: read, searched and deleted there, never added by hand."""

from __future__ import annotations

import pytest
from django.test import Client

from runs.models import Run
from tests.helpers import bare_run
from tests.pages.helpers import make_user


@pytest.mark.django_db
def test_the_admin_offers_no_add_run_and_refuses_one():
    """ "Add run" saved a row with no models, a 500 (a review): a run is launched, never
    typed in, so the admin neither offers nor takes one."""
    admin = make_user("root", staff=True)
    admin.is_superuser = True
    admin.save()
    client = Client()
    client.force_login(admin)
    run = bare_run("<b>q</b>", status=Run.Status.SUCCEEDED)
    listing = client.get("/admin/runs/run/")
    assert listing.status_code == 200 and run.id in listing.content.decode()
    assert "/admin/runs/run/add/" not in listing.content.decode()
    assert client.get("/admin/runs/run/add/").status_code == 403
    assert client.post("/admin/runs/run/add/", {"question": "x"}).status_code == 403
    assert Run.objects.count() == 1
    assert client.get(f"/admin/runs/run/{run.id}/change/").status_code == 200
