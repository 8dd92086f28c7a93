"""Plotly for the pages that chart (the run page's five views, the venue and worker
histories), served compressed and cached for good.

The bundle is plotly.js's cartesian partial bundle (scatter, bar, heatmap and a few
more, 1.5 MB against the full bundle's 4.8 MB), vendored in static/vendor/ with its
licence: every chart the pages draw is one of those types (the run page's Flow is drawn
as SVG by static/frlm/views.js, not as a Plotly sankey). It is gzipped once per process,
level 9, and kept in memory: a third of a megabyte goes over the wire instead of one and
a half. Its URL names its version, so a browser keeps it a year without asking again.
"""

from __future__ import annotations

import functools

from django.http import HttpRequest, HttpResponse, HttpResponseNotModified
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

from frlm_web.static_files import Entry, gzip_accepted, load_file

PLOTLY_VERSION = "4.1.1"
PLOTLY_FILE = f"plotly-cartesian-{PLOTLY_VERSION}.min.js"
YEAR_S = 365 * 86_400


@functools.cache
def _plotly() -> Entry:
    """The vendored bundle, gzipped and with its ETag (read as any static file is)."""
    entry = load_file(f"vendor/{PLOTLY_FILE}")
    if entry is None or entry.packed is None:
        raise RuntimeError(f"static/vendor/{PLOTLY_FILE} is missing: restore it from git")
    return entry


def accepts_gzip(request: HttpRequest) -> bool:
    return gzip_accepted(request.headers.get("Accept-Encoding", ""))


@require_GET
def plotly_js(request: HttpRequest) -> HttpResponse:
    """The Plotly bundle: gzipped when the browser takes gzip, cached a year (immutable)."""
    entry = _plotly()
    etag = entry.etag.decode()
    if request.headers.get("If-None-Match") == etag:
        response: HttpResponse = HttpResponseNotModified()
    elif accepts_gzip(request):
        response = HttpResponse(entry.packed, content_type="text/javascript; charset=utf-8")
        response["Content-Encoding"] = "gzip"
    else:
        response = HttpResponse(entry.body, content_type="text/javascript; charset=utf-8")
    response["ETag"] = etag
    response["Cache-Control"] = f"public, max-age={YEAR_S}, immutable"
    patch_vary_headers(response, ["Accept-Encoding"])
    return response
