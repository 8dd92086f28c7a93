"""The web server: daphne, with every request body bounded before it is read.

    python -m frlm_web.web_server <daphne's arguments>

daphne serves HTTP itself (there is no proxy in front of it by default), through Twisted,
which holds a request's whole body and, for a form post, parses it whole before daphne or
Django see it: a review measured the web process grow by 1.4 GB for one anonymous 128 MB
multipart POST to the sign-in page, and by 1.55 GB for a launcher upload its form then
refused as over its 64 MB. Every page, socket and gateway worker shares that process.

Here a body longer than FRLM_HTTP_MAX_BODY (the launcher's upload limit and a megabyte for
the form's other fields) is refused with 413 as soon as its length is known: at the headers
for a Content-Length, as it comes for a chunked one, before it is kept. Twisted's own form
parsing is off: Django parses the forms, and Twisted's parse was what multiplied the body.
A body within the limit is kept as Twisted keeps it (a file on disk past 100 kB) and handed
to Django in chunks, as daphne does.
"""

from __future__ import annotations

import daphne.server  # first: it installs Twisted's asyncio reactor
from daphne import http_protocol
from daphne.cli import CommandLineInterface
from django.conf import settings

REFUSAL = (
    "the request body is larger than this server takes ({limit:,} bytes, "
    "FRLM_HTTP_MAX_BODY): send a smaller one (an upload of at most 64 MB)\n"
)


class BoundedRequest(http_protocol.WebRequest):
    """daphne's request, its body bounded (FRLM_HTTP_MAX_BODY) and not parsed by Twisted."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False
        self.body_limit = settings.FRLM_HTTP_MAX_BODY
        self.body_seen = 0
        self.refused = False

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.body_limit:
            self.refuse()
        super().gotLength(None if self.refused else length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self.body_seen += len(data)
        if self.body_seen > self.body_limit:  # a chunked body, or more than it said
            self.refuse()
            return
        super().handleContentChunk(data)

    def refuse(self) -> None:
        """413 and the connection closed, whatever else was sent: nothing of the body kept."""
        self.refused = True
        body = REFUSAL.format(limit=self.body_limit).encode()
        self.channel.transport.write(
            b"HTTP/1.1 413 Content Too Large\r\n"
            b"Content-Type: text/plain; charset=utf-8\r\n"
            b"Connection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.channel.transport.loseConnection()

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self.refused:
            super().requestReceived(command, path, version)


class BoundedHTTPFactory(http_protocol.HTTPFactory):
    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BoundedRequest
        return protocol


def main() -> None:
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "frlm_web.settings")
    django.setup()  # for the setting; the application module sets Django up anyway
    # daphne's Server builds its HTTP factory by this name: ours bounds the bodies.
    daphne.server.HTTPFactory = BoundedHTTPFactory
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
