"""Sign-in, throttled: failed attempts count against the source address, the username tried
from that address, and the username from anywhere. Past FRLM_LOGIN_FAIL_LIMIT for the
address or the pair within FRLM_LOGIN_FAIL_WINDOW_S, or USERNAME_FACTOR times that for the
username (guessing spread over many addresses), the form is answered 429, saying when to try
again, without checking the password. The username alone at the plain limit let anyone lock
a known user out from one address (a review); now one address is stopped long before it
could. The same guard stands before the admin's own sign-in form."""

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


USERNAME_FACTOR = 10  # the username's own limit, from all addresses, over the plain one


def _username_keys(request: HttpRequest) -> list[str]:
    """The username's key from this address, and from anywhere (none without a username)."""
    username = str(request.POST.get("username", "")).strip().lower()
    if not username:
        return []
    digest = hashlib.sha256(username.encode()).hexdigest()[:32]
    address = str(request.META.get("REMOTE_ADDR") or "unknown")[:64]
    pair = hashlib.sha256(f"{username}\n{address}".encode()).hexdigest()[:32]
    return [f"frlm:login:fail:pair:{pair}", f"frlm:login:fail:user:{digest}"]


def throttled_sign_in(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """1. a POST past the limit of its address, its username from that address, or its
    username from anywhere is refused (429), 2. the view checks the password, 3. a POST
    answered with the form again (200: it did not sign in) counts against all three; one
    that signs in forgets the username's."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        limit, window = settings.FRLM_LOGIN_FAIL_LIMIT, settings.FRLM_LOGIN_FAIL_WINDOW_S
        named = _username_keys(request)
        limits = [(_address_key(request), limit)]
        if named:
            limits += [(named[0], limit), (named[1], limit * USERNAME_FACTOR)]
        waits = [w for k, n in limits if (w := throttle.wait(k, n, window)) is not None]
        if waits:
            return _refused(request, max(waits))
        response = view(request, *args, **kwargs)
        if response.status_code == 200:
            for key, _ in limits:
                throttle.hit(key, window)
        elif request.user.is_authenticated:
            for key in named:
                throttle.forget(key)
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
