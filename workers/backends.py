"""Model backends. Every model, the simulated one included, is reached through the
`openai` client over the OpenAI-compatible HTTP API, so the same code path runs against
OpenAI, vLLM, Ollama, a llama.cpp server or FRLM's simulated model."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings

from frlm_web import fastjson
from frlm_web.money import money
from traces import caps
from traces.cassette import cassette, request_hash
from workers.jobs import MAX_TOKENS
from workers.pricing import cost_of

if TYPE_CHECKING:
    import openai

SIM_ROOT_MODEL = "frlm-sim-root"
SIM_WORKER_MODEL = "frlm-sim-worker"


class ModelError(Exception):
    """A model call failed; the message says what to do about it."""


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "sim", "openai", or "cassette" (a recorded run's replies)
    model: str
    base_url: str
    sim: dict[str, Any] = field(default_factory=dict)  # the simulated model's profile
    # For "cassette": {"run": the recorded run's id, "live": a ModelSpec dict for requests
    # the recording does not hold, or None to fail on them}.
    replay: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.kind == "sim":
            return f"{self.model} (simulated model)"
        if self.kind == "cassette":
            return f"{self.model} (replayed from run {self.replay.get('run')})"
        return f"{self.model} at {self.base_url}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(
            data["kind"],
            data["model"],
            data["base_url"],
            dict(data.get("sim") or {}),
            dict(data.get("replay") or {}),
        )

    def live(self) -> ModelSpec | None:
        """What answers when the recording does not: the spec itself unless a cassette."""
        if self.kind != "cassette":
            return self
        live = self.replay.get("live")
        return ModelSpec.from_dict(live) if live else None


def cassette_spec(recorded: dict[str, Any], run_id: str, *, live: ModelSpec | None) -> ModelSpec:
    """A spec that answers from run `run_id`'s recording of the model `recorded`."""
    return ModelSpec(
        "cassette",
        recorded["model"],
        "",
        dict(recorded.get("sim") or {}),
        {"run": run_id, "live": live.to_dict() if live else None},
    )


def model_spec(
    value: str, *, role: str, base_url: str | None = None, model: str | None = None
) -> ModelSpec:
    """Parse `sim`, `openai` or `openai:MODEL` for a root or worker model."""
    value = (value or "sim").strip()
    if value == "sim":
        default = SIM_ROOT_MODEL if role == "root" else SIM_WORKER_MODEL
        return ModelSpec("sim", default, base_url or settings.FRLM_SIM_URL)
    kind, _, name = value.partition(":")
    if kind != "openai":
        raise ValueError(
            f"unknown {role} model {value!r}: use 'sim' (the simulated model) or "
            "'openai' / 'openai:MODEL' for an OpenAI-compatible endpoint (with --base-url)"
        )
    name = name or model
    if not name:
        raise ValueError(f"the {role} model needs a model name: 'openai:MODEL' or --model MODEL")
    return ModelSpec("openai", name, base_url or settings.FRLM_OPENAI_BASE_URL)


def command_models(
    root: str | None, worker: str | None, *, base_url: str | None, model: str | None
) -> tuple[ModelSpec | None, ModelSpec | None]:
    """The root and worker models a command names (None for one it leaves as it is).
    `--base-url` and `--model` go to its `openai` models only: a role left on the simulated
    model keeps the simulated server (it was sent to the endpoint too, and failed with
    advice to start the simulated server)."""
    endpoint = [value for value in (root, worker) if value is not None and not _sim(value)]
    if (base_url or model) and not endpoint:
        raise ValueError(
            "--base-url and --model name an OpenAI-compatible endpoint and its model: give "
            "them with --root-model openai[:MODEL] and/or --worker-model openai[:MODEL] "
            "(the simulated model needs neither)"
        )
    if base_url:
        check_base_url(base_url)

    def spec(value: str | None, role: str) -> ModelSpec | None:
        if value is None:
            return None
        if _sim(value):
            return model_spec(value, role=role)
        return model_spec(value, role=role, base_url=base_url, model=model)

    return spec(root, "root"), spec(worker, "worker")


def _sim(value: str) -> bool:
    return (value or "sim").strip() == "sim"  # as model_spec reads it: empty is `sim`


def check_base_url(url: str) -> None:
    """An endpoint's base URL is http(s) with a host, or a ValueError that says so (a
    command's check: only commands name an endpoint by URL)."""
    from frlm_web.commands import is_http_url  # noqa: PLC0415 - commands only

    if not is_http_url(url):
        raise ValueError(
            f"--base-url {url!r} is not an http:// or https:// URL: give the endpoint's base, "
            "such as http://127.0.0.1:11434/v1"
        )


@dataclass
class ChatResult:
    text: str
    tokens_in: int
    tokens_out: int
    cost: Decimal | None  # exact dollars; None when the model's price is unknown
    ms: float
    model: str
    request_hash: str = ""
    replayed: bool = False
    cut_from: int = 0  # the reply's whole length when it was cut to FRLM_MAX_REPLY_CHARS


def _api_key(spec: ModelSpec) -> str:
    if spec.kind == "sim":
        return "simulated"
    key = os.environ.get("FRLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    # Local servers (vLLM, Ollama, llama.cpp) accept any key; OpenAI itself will say 401.
    return key or "no-key-set"


def preload() -> None:
    """Import the model client now. A command that never calls a model does not pay for it,
    but a process that lives to call models (a conductor, a venue worker) would otherwise
    pay it inside its first call: the demo's first root turn took 859 ms instead of 89 ms,
    and its first batch 4.7 s instead of 3.2 s."""
    import httpx  # noqa: F401
    import openai  # noqa: F401


@functools.cache
def _async_client(
    loop: object, base_url: str, api_key: str, timeout: float, retries: int
) -> openai.AsyncOpenAI:
    """The asyncio twin of `_client`, one per event loop (its connections belong to it)."""
    return _sdk(True, base_url, api_key, timeout, retries)


@functools.cache
def _client(base_url: str, api_key: str, timeout: float, retries: int) -> openai.OpenAI:
    return _sdk(False, base_url, api_key, timeout, retries)


def _sdk(on_loop: bool, base_url: str, api_key: str, timeout: float, retries: int) -> Any:
    import httpx
    import openai  # a third of a second to import: only a process that calls a model pays

    from workers import http_transport as transports

    sdk, http, transport = (
        (openai.AsyncOpenAI, transports.AsyncModelHTTPClient, transports.for_url_async)
        if on_loop
        else (openai.OpenAI, transports.ModelHTTPClient, transports.for_url)
    )
    return sdk(
        base_url=base_url,
        api_key=api_key,
        timeout=timeout,
        max_retries=retries,
        # The SDK over kept-alive HTTP/1.1 connections: httpx's own transport cost more
        # CPU per call than the rest of a sub-query; and no cookie jar, which cost an
        # eighth of what remained (workers/http_transport.py).
        http_client=http(
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            timeout=timeout,
            transport=transport(base_url, settings.FRLM_MODEL_TRANSPORT),
        ),
    )


@dataclass
class _Call:
    """One chat completion on its way: what `chat` and `achat` share."""

    spec: ModelSpec
    key: str  # the request's hash
    body: dict[str, Any]
    timeout: float
    retries: int

    @classmethod
    def prepare(
        cls,
        spec: ModelSpec,
        messages: list[dict[str, str]],
        *,
        timeout: float | None,
        retries: int | None,
        max_tokens: int | None,
        recorded: dict[str, Any] | None,
    ) -> _Call | ChatResult:
        """The request to send, or the reply a replay already holds (ModelError where the
        recording failed, or has none and may not go live)."""
        key = request_hash(spec.model, messages)
        if spec.kind == "cassette" and recorded and "error" in recorded:
            # The recorded attempt failed: it fails again, so the replay retries as it did.
            raise ModelError(str(recorded["error"]))
        if spec.kind == "cassette" and recorded and recorded.get("request_hash") == key:
            # The replay's job carried the reply: this process need not load the cassette.
            cost = recorded.get("cost")
            return ChatResult(
                recorded["text"],
                recorded.get("tokens_in") or 0,
                recorded.get("tokens_out") or 0,
                None if cost is None else money(cost),
                recorded.get("ms") or 0.0,
                spec.model,
                key,
                replayed=True,
            )
        if spec.kind == "cassette":
            taped = cassette(spec.replay["run"]).get(key)
            if taped is not None:
                return ChatResult(
                    taped.text,
                    taped.tokens_in,
                    taped.tokens_out,
                    None if taped.cost is None else money(taped.cost),
                    taped.ms,
                    spec.model,
                    key,
                    replayed=True,
                )
            live = spec.live()
            if live is None:
                raise ModelError(
                    f"run {spec.replay['run']}'s recording has no reply for this request to "
                    f"{spec.model}: the replay left the recorded path "
                    "(replay with --from-turn to go on live from a turn)"
                )
            spec = live
        body: dict[str, Any] = {"model": spec.model, "messages": messages}
        if spec.kind == "sim" and spec.sim:
            body["sim"] = spec.sim
        if max_tokens:
            body["max_tokens"] = max_tokens
        return cls(
            spec,
            key,
            body,
            timeout or settings.FRLM_MODEL_TIMEOUT_S,
            settings.FRLM_MODEL_RETRIES if retries is None else retries,
        )

    def body_bytes(self) -> bytes:
        """The request's body as JSON bytes, which the client sends as they are: its own
        encoder (the standard library's) and its reader took 2% of a worker's CPU at 1 ms
        model latency (issue 18's profile), orjson a tenth of that."""
        return fastjson.dumps(self.body)

    @property
    def client_args(self) -> tuple[str, str, float, int]:
        return (self.spec.base_url, _api_key(self.spec), self.timeout, self.retries)

    def error(self, exc: Exception) -> ModelError:
        """What the SDK raised, as a ModelError that says what to do."""
        import openai

        spec = self.spec
        if isinstance(exc, openai.APITimeoutError):  # a connection error to the SDK
            # Reachable but slow: "cannot reach" sent a user to check a server that was up
            # (a review).
            return ModelError(
                f"the model endpoint {spec.base_url} did not answer within {self.timeout:g} s "
                f"(tried {self.retries + 1} time(s)); a slow model needs a longer timeout "
                "(FRLM_MODEL_TIMEOUT_S for the root model, policy subquery_timeout_s for "
                "sub-queries; FRLM_MODEL_RETRIES for fewer tries), else check the server"
            )
        if isinstance(exc, openai.APIConnectionError):
            hint = (
                "start it with `python manage.py frlm_simserver`"
                if spec.kind == "sim"
                # Said on the run page too, where there is no --base-url (a review).
                else "check the endpoint's URL (frlm_run's --base-url, FRLM_ENDPOINTS for the "
                "launcher, a worker's own frlm_worker --backend) and that its server is up"
            )
            return ModelError(f"cannot reach the model endpoint {spec.base_url} ({exc}); {hint}")
        if isinstance(exc, openai.APIStatusError):
            return ModelError(
                f"the model endpoint {spec.base_url} answered HTTP {exc.status_code} for "
                f"{spec.model}: {_error_text(exc)}{_status_hint(exc.status_code)}"
            )
        return ModelError(f"the model endpoint {spec.base_url} answered garbage: {exc}")

    def result(self, response: Any, started: float) -> ChatResult:
        result = _result(self.spec, response, (time.perf_counter() - started) * 1000)
        result.request_hash = self.key
        return result


def _failures() -> tuple[type[Exception], ...]:
    """What a call through the SDK may raise that is the endpoint's doing."""
    import openai  # loaded by the client already

    return (openai.OpenAIError, ValueError, TypeError, KeyError)


def chat(
    spec: ModelSpec,
    messages: list[dict[str, str]],
    *,
    timeout: float | None = None,
    retries: int | None = None,
    max_tokens: int | None = None,
    recorded: dict[str, Any] | None = None,
) -> ChatResult:
    """One chat completion; raises ModelError with an actionable message. Every result
    carries the hash of its request, so a trace is also the run's cassette."""
    call = _Call.prepare(
        spec, messages, timeout=timeout, retries=retries, max_tokens=max_tokens, recorded=recorded
    )
    if isinstance(call, ChatResult):
        return call
    client = _client(*call.client_args)
    import httpx

    started = time.perf_counter()
    try:
        # The client's own verb for an endpoint by path (its README's "undocumented
        # requests"): it still does the request, the API key, retries with backoff and
        # the error mapping, but skips converting the body through the SDK's typed
        # parameters and wrapping the reply (1.8 ms of CPU per call that way, 1.25 ms
        # this way: a fanout of thousands of sub-queries feels it).
        http = client.post("/chat/completions", content=call.body_bytes(), cast_to=httpx.Response)
        response = fastjson.loads(http.content)
    except _failures() as exc:
        raise call.error(exc) from exc
    return call.result(response, started)


async def achat(
    spec: ModelSpec,
    messages: list[dict[str, str]],
    *,
    timeout: float | None = None,
    retries: int | None = None,
    recorded: dict[str, Any] | None = None,
) -> ChatResult:
    """`chat` for a task of an asyncio worker (workers/aslots.py): the same request, reply
    and errors, through the SDK's AsyncOpenAI, whose calls from sixteen tasks of one loop
    cost a third less CPU than the same calls from sixteen threads (bench/modelcall.py)."""
    call = _Call.prepare(
        spec, messages, timeout=timeout, retries=retries, max_tokens=None, recorded=recorded
    )
    if isinstance(call, ChatResult):
        return call
    import asyncio

    import httpx

    client = _async_client(asyncio.get_running_loop(), *call.client_args)
    started = time.perf_counter()
    try:
        http = await client.post(
            "/chat/completions", content=call.body_bytes(), cast_to=httpx.Response
        )
        response = fastjson.loads(http.content)
    except _failures() as exc:
        raise call.error(exc) from exc
    return call.result(response, started)


def _status_hint(status: int) -> str:
    """What to do about an endpoint's HTTP error (the reason alone said what happened, not
    what to do; a review)."""
    if status in (401, 403):
        return "; check the API key (FRLM_API_KEY or OPENAI_API_KEY) and its rights"
    if status == 404:
        return "; check the model's name and the endpoint's URL"
    if status == 429:
        return (
            "; the endpoint is limiting the rate: send fewer sub-queries at once (policy "
            "max_inflight), or wait and run again"
        )
    if status >= 500:
        return "; the server failed: see its log, or try again later"
    return ""


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
    return str(exc.message)[:300]


def _usage(spec: ModelSpec, usage: Any) -> tuple[int, int]:
    """The reply's prompt and completion token counts (0 where it gives none). A count
    that is not a whole number from 0 to MAX_TOKENS is the endpoint's error, said as such:
    a root reply with 10**15 tokens wrote a two-billion-dollar cost no page could read back
    again, and a negative one failed its run as an internal error (a review)."""
    if not isinstance(usage, dict):
        return 0, 0
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key) or 0
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().isdecimal() and len(value) < 20:
            value = int(value)  # "²" is a digit that int() refuses; isdecimal() is not one
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
            raise ModelError(
                f"the model endpoint {spec.base_url} reported usage.{key} = {str(value)[:40]}, "
                f"not a token count from 0 to {MAX_TOKENS:,}: the server (or a proxy before "
                "it) counts wrongly; fix it or use another endpoint"
            )
        counts.append(value)
    return counts[0], counts[1]


def _result(spec: ModelSpec, response: Any, ms: float) -> ChatResult:
    try:
        text = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(
            f"the model endpoint {spec.base_url} answered something that is not a chat "
            f"completion (no choices[0].message.content): {str(response)[:200]}"
        ) from exc
    if not isinstance(text, str):
        raise ModelError(f"the model endpoint {spec.base_url} returned no text content")
    text, cut_from = caps.cut(text)
    tokens_in, tokens_out = _usage(spec, response.get("usage"))
    return ChatResult(
        text,
        tokens_in,
        tokens_out,
        cost_of(spec.model, tokens_in, tokens_out),
        ms,
        spec.model,
        cut_from=cut_from,
    )
