"""Plotly for the pages that chart (the run page's five views, the venue and worker
histories), served compressed and cached for good.

The bundle is plotly.js built for FRLM with the three trace types the pages draw (scatter,
bar, heatmap; static/vendor/README.md says how): 1.18 MB against 1.5 MB for Plotly's
cartesian partial bundle and 4.8 MB for the full one, and it runs in about 200 ms where
the cartesian bundle took over 500 ms in a fresh browser on a 2-core machine (the run
page's views waited for it). The run page's Flow is drawn as SVG by static/frlm/views.js,
not as a Plotly sankey. It is gzipped once per process, level 9, and kept in memory: 0.41
MB goes over the wire. Its URL names its version, so a browser keeps it a year without
asking again.
"""

from __future__ import annotations

import functools

from django.http import HttpRequest, HttpResponse, HttpResponseNotModified
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

from frlm_web.static_files import Entry, gzip_accepted, load_file

PLOTLY_VERSION = "4.1.1"
PLOTLY_FILE = f"plotly-frlm-{PLOTLY_VERSION}.min.js"
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
