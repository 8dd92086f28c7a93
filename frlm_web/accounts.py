"""Sign-in, throttled: failed attempts count against the source address and against the
username tried; past FRLM_LOGIN_FAIL_LIMIT of either within FRLM_LOGIN_FAIL_WINDOW_S the
form is answered 429, saying when to try again, without checking the password. The same
guard stands before the admin's own sign-in form."""

from __future__ import annotations

import datetime
import functools
import hashlib
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from frlm_web import throttle


def _address_key(request: HttpRequest) -> str:
    return f"frlm:login:fail:addr:{str(request.META.get('REMOTE_ADDR') or 'unknown')[:64]}"


def _username_key(request: HttpRequest) -> str | None:
    username = str(request.POST.get("username", "")).strip().lower()
    if not username:
        return None
    digest = hashlib.sha256(username.encode()).hexdigest()[:32]
    return f"frlm:login:fail:user:{digest}"


def throttled_sign_in(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """1. a POST from an address or for a username past the limit is refused (429),
    2. the view checks the password, 3. a POST answered with the form again (200: it
    did not sign in) counts against both; one that signs in forgets the username's."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        limit, window = settings.FRLM_LOGIN_FAIL_LIMIT, settings.FRLM_LOGIN_FAIL_WINDOW_S
        keys = [k for k in (_address_key(request), _username_key(request)) if k]
        waits = [w for w in (throttle.wait(k, limit, window) for k in keys) if w is not None]
        if waits:
            return _refused(request, max(waits))
        response = view(request, *args, **kwargs)
        if response.status_code == 200:
            for key in keys:
                throttle.hit(key, window)
        elif request.user.is_authenticated and len(keys) == 2:
            throttle.forget(keys[1])
        return response

    return wrapped


def _refused(request: HttpRequest, retry: int) -> HttpResponse:
    at = timezone.now() + datetime.timedelta(seconds=retry)
    refusal = (
        "Too many failed sign-in attempts from this address or for this username. "
        f"Try again in {retry} s, after {at:%H:%M:%S} UTC."
    )
    context = {
        "form": AuthenticationForm(request),
        "next": request.POST.get("next", ""),
        "refusal": refusal,
    }
    response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(retry)
    return response


login = throttled_sign_in(auth_views.LoginView.as_view())
