"""The web server's static files (frlm_web/static_files.py), over the real daphne: from
memory, gzipped when the browser takes it, 304 when its copy is current, nothing outside
the static directories."""

from __future__ import annotations

import gzip
import http.client
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings

CSS = Path(settings.BASE_DIR) / "static" / "frlm.css"


def ask(web: str, path: str, method: str = "GET", **headers: str):
    url = urlparse(web)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def test_it_serves_a_static_file_plain_or_gzipped_and_304_when_current(web):
    status, headers, body = ask(web, "/static/frlm.css")
    assert status == 200 and body == CSS.read_bytes()
    assert headers["content-type"] == "text/css; charset=utf-8"
    assert "content-encoding" not in headers and headers["vary"] == "Accept-Encoding"
    status, packed_headers, packed = ask(web, "/static/frlm.css", **{"Accept-Encoding": "gzip"})
    assert status == 200 and packed_headers["content-encoding"] == "gzip"
    assert gzip.decompress(packed) == body and len(packed) < len(body)
    assert int(packed_headers["content-length"]) == len(packed)
    status, _, nothing = ask(web, "/static/frlm.css", **{"If-None-Match": headers["etag"]})
    assert (status, nothing) == (304, b"")
    status, head_headers, nothing = ask(web, "/static/frlm.css", "HEAD")
    assert status == 200 and nothing == b"" and head_headers["etag"] == headers["etag"]
    # An app's own static files are found too (the admin's).
    assert ask(web, "/static/admin/css/base.css")[0] == 200


def test_it_refuses_what_is_not_a_static_file(web):
    for path in [
        "/static/no-such-file.js",
        "/static/../frlm_web/settings.py",
        "/static/%2e%2e/frlm_web/settings.py",
        "/static/frlm/../../manage.py",
        "/static//etc/passwd",
        "/static/%00frlm.css",
        "/static/",
        "/static/frlm",  # a directory
    ]:
        status, _, body = ask(web, path)
        assert status == 404, path
        assert b"SECRET" not in body and b"import" not in body
    status, headers, _ = ask(web, "/static/frlm.css", "POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
