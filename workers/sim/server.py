"""The simulated model's HTTP server: the OpenAI chat-completions API on the standard
library's threading HTTP server, so the project's real `openai` client talks to it.

One thread per connection (HTTP/1.1 keep-alive); a request's simulated latency is a sleep
in its own thread, so a hundred slow requests in flight cost a hundred idle threads and
no CPU. The latency runs from the moment the request arrived, with the reply made while
it runs, as a real model's latency includes reading the request: otherwise the server's
own work, which queues when many replies fall due at once, comes on top of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypedDict
from urllib.parse import urlsplit

from frlm_web import jsontext
from workers.sim import OWNER, ROOT_MODEL, WORKER_MODEL, ChatMessage
from workers.sim.profile import Decision, Profile, ProfileError, decide, parse_profile
from workers.sim.reader import worker_reply
from workers.sim.root import root_reply

FINGERPRINT = "frlm-simulated"
MAX_BODY_BYTES = 256 * 1024 * 1024  # a worker prompt carries a fragment; be generous
SIMULATED_FAILURE = "simulated worker failure"


class ModelCard(TypedDict):
    id: str
    object: str
    owned_by: str


class ErrorBody(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Choice(TypedDict):
    index: int
    message: dict[str, str]
    finish_reason: str
    logprobs: None


class ChatCompletion(TypedDict):
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str


class RequestError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI-style error."""

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = ErrorBody(message=message, type=kind, param=None, code=code)


class SimServer(ThreadingHTTPServer):
    daemon_threads = True  # a sleeping request must never keep the process alive
    request_queue_size = 256  # the listen backlog: 64+ clients connect at once

    def __init__(self, address: tuple[str, int], defaults: Profile, quiet: bool) -> None:
        self.defaults = defaults
        self.quiet = quiet
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-reply (a cancelled sub-query) is normal here.
        if not self.quiet:
            super().handle_error(request, client_address)


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    defaults: Profile | None = None,
    *,
    quiet: bool = True,
) -> SimServer:
    """A bound, listening server; call `serve_forever()` (in a thread, if need be)."""
    return SimServer((host, port), defaults or Profile(), quiet)


def base_url(server: SimServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/v1"


@contextmanager
def serving(
    defaults: Profile | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[SimServer]:
    """Run a server in a background thread for the duration of a `with` block."""
    server = make_server(host, port, defaults)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.1},
        name="frlm-simserver",
        daemon=True,
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def model_cards() -> list[ModelCard]:
    return [
        ModelCard(id=model, object="model", owned_by=OWNER) for model in (ROOT_MODEL, WORKER_MODEL)
    ]


def complete(
    body: object, defaults: Profile, *, retry_count: int = 0, arrived: float | None = None
) -> tuple[ChatCompletion, Decision]:
    """Check a chat-completions body, produce the reply and sleep what is left of its
    latency since the request `arrived` (time.monotonic(); default now). A client's own
    retry (the openai client counts them in a header) is an independent draw.

    Raises RequestError for what a client got wrong and for a simulated failure.
    """
    arrived = time.monotonic() if arrived is None else arrived
    request = _check_body(body)
    model, messages = request["model"], _messages(request["messages"])
    try:
        profile = parse_profile(_sim_fields(request.get("sim")), defaults)
    except ProfileError as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, str(exc), code="invalid_sim_profile") from exc
    if retry_count:
        profile = dataclasses.replace(profile, attempt=profile.attempt + retry_count)
    decision = decide(profile, model, messages)
    completion = (
        None if decision.fail else _completion(model, messages, _reply(model, messages, decision))
    )
    left = decision.delay_s - (time.monotonic() - arrived)
    if left > 0:
        time.sleep(left)
    if completion is None:
        raise RequestError(HTTPStatus.INTERNAL_SERVER_ERROR, SIMULATED_FAILURE, "server_error")
    return completion, decision


def _check_body(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            "streaming is not supported by the simulated model; send stream=false",
            code="stream_not_supported",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'model' is required and must be a string")
    if model not in (ROOT_MODEL, WORKER_MODEL):
        raise RequestError(
            HTTPStatus.NOT_FOUND,
            f"The model '{model}' does not exist on the FRLM simulated model server; "
            f"it serves {ROOT_MODEL} and {WORKER_MODEL}.",
            code="model_not_found",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'messages' must be a non-empty list")
    return body


def _messages(raw: list[object]) -> list[ChatMessage]:
    messages = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"messages[{index}] must be an object with a 'role'"
            )
        messages.append(ChatMessage(role=item["role"], content=_text(item.get("content"), index)))
    return messages


def _text(content: object, index: int) -> str:
    """Message content as text: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if len(parts) == len(content) and all(isinstance(p, str) for p in parts):
            return "".join(parts)  # type: ignore[arg-type]
    raise RequestError(
        HTTPStatus.BAD_REQUEST,
        f"messages[{index}].content must be a string or a list of text parts",
    )


def _sim_fields(sim: object) -> Mapping[str, object]:
    if sim is None:
        return {}
    if not isinstance(sim, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "'sim' must be an object", code="invalid_sim")
    return sim


def _reply(model: str, messages: list[ChatMessage], decision: Decision) -> str:
    if model == ROOT_MODEL:
        return root_reply(messages)
    return worker_reply(messages, random.Random(decision.lie_seed) if decision.lie else None)


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _completion(model: str, messages: list[ChatMessage], content: str) -> ChatCompletion:
    prompt_tokens = _tokens(sum(len(m["content"]) for m in messages))
    completion_tokens = _tokens(len(content))
    # The id is a function of the request, so a replayed run records identical ids.
    digest = hashlib.sha256(
        json.dumps([model, messages, content], ensure_ascii=False).encode("utf-8")
    ).hexdigest()
    return ChatCompletion(
        id=f"chatcmpl-sim-{digest[:24]}",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                index=0,
                message={"role": "assistant", "content": content},
                finish_reason="stop",
                logprobs=None,
            )
        ],
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        ),
        system_fingerprint=FINGERPRINT,
    )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every reply carries Content-Length
    # Headers and body go out in two writes; with Nagle on, the second waits for the
    # client's delayed ACK (about 40 ms) on every keep-alive request.
    disable_nagle_algorithm = True
    server_version = "frlm-simulated/1"
    sys_version = ""
    timeout = 300  # an idle keep-alive connection gives its thread back after this
    server: SimServer

    def do_GET(self) -> None:
        path = self._path()
        if path == "/v1/models":
            self._send_json(HTTPStatus.OK, {"object": "list", "data": model_cards()})
            return
        for card in model_cards():
            if path == f"/v1/models/{card['id']}":
                self._send_json(HTTPStatus.OK, card)
                return
        self._send_error(RequestError(HTTPStatus.NOT_FOUND, f"no route for GET {path}"))

    def parse_request(self) -> bool:
        # Called once the request line is read (not while an idle keep-alive connection
        # waits for it): the request's latency starts here, before its headers are parsed.
        self.arrived = time.monotonic()
        return super().parse_request()

    def do_POST(self) -> None:
        path = self._path()
        try:
            body = self._read_json()
            if path != "/v1/chat/completions":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no route for POST {path}")
            completion, decision = complete(
                body, self.server.defaults, retry_count=self._retry_count(), arrived=self.arrived
            )
        except RequestError as exc:
            self._send_error(exc)
            return
        except Exception as exc:  # a bug here must reach the client as a clear 500
            self._send_error(
                RequestError(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"simulated model internal error: {type(exc).__name__}: {exc}",
                    "server_error",
                )
            )
            if not self.server.quiet:
                raise
            return
        self._send_json(
            HTTPStatus.OK,
            completion,
            {
                "X-FRLM-Sim-Delay-Ms": f"{decision.delay_s * 1000:.3f}",
                "X-FRLM-Sim-Straggler": "1" if decision.straggler else "0",
                "X-FRLM-Sim-Lie": "1" if decision.lie else "0",
            },
        )

    def _retry_count(self) -> int:
        try:
            return max(0, int(self.headers.get("X-Stainless-Retry-Count", "0")))
        except ValueError:
            return 0

    def _path(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _read_json(self) -> object:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length body")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            # The unread body would be taken for the next request: drop the connection.
            self.close_connection = True
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "bad or too large body")
        raw = self.rfile.read(length)
        try:
            return jsontext.loads(raw)
        except ValueError as exc:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"the request body is not valid JSON: {exc}"
            ) from exc

    def _send_error(self, exc: RequestError) -> None:
        self._send_json(exc.status, {"error": exc.error})

    def _send_json(
        self, status: HTTPStatus, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-FRLM-Simulated", "1")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # The client gave up (a cancelled or timed-out sub-query); nobody to tell.
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)
