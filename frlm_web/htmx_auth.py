"""A signed-out htmx request is sent to sign in, not answered with the sign-in page.

The dashboard's panels poll with htmx. When the session ends (signed out in another tab,
expired), login_required answers a poll with a redirect to the sign-in page; the browser
follows it inside the XMLHttpRequest, and htmx pasted the whole sign-in page into each
panel while the header still named the user. A redirect to sign in is turned, for an htmx
request, into htmx's own redirect (HX-Redirect): the whole page goes to sign in, and comes
back to where it was after."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect


def _page(request: HttpRequest) -> str:
    """The page the htmx request came from (HX-Current-URL), as a path on this site."""
    current = request.headers.get("HX-Current-URL", "")
    if not url_has_allowed_host_and_scheme(
        current, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return "/"
    parts = urlsplit(current)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class HtmxSignIn:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            request.headers.get("HX-Request") == "true"
            and response.status_code in (301, 302)
            and urlsplit(response.get("Location", "")).path == settings.LOGIN_URL
        ):
            return HttpResponseClientRedirect(
                f"{settings.LOGIN_URL}?{urlencode({'next': _page(request)})}"
            )
        return response
