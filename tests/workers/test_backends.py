"""workers.backends.chat over real HTTP on loopback: what it sends through the openai
client, and the message a user gets for each way an endpoint can answer wrongly."""

from __future__ import annotations

import json

import pytest

from tests.helpers import endpoint
from workers.backends import ModelError, ModelSpec, chat
from workers.sim.server import base_url, serving

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def completion(text: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1},
        }
    ).encode()


def test_it_posts_a_chat_completion_with_the_key_and_reads_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FRLM_API_KEY", "sk-test-key")
    with endpoint(lambda _: (200, completion("4"))) as (url, seen):
        reply = chat(ModelSpec("openai", "m", url), MESSAGES, max_tokens=5, retries=0)
    assert (reply.text, reply.tokens_in, reply.tokens_out) == ("4", 7, 1)
    assert reply.request_hash and reply.ms > 0
    (request,) = seen
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer sk-test-key"
    assert request["body"] == {"model": "m", "messages": MESSAGES, "max_tokens": 5}


def test_the_simulated_model_gets_its_profile_in_the_body() -> None:
    with endpoint(lambda _: (200, completion("x"))) as (url, seen):
        chat(ModelSpec("sim", "frlm-sim-worker", url, {"latency_ms": 5}), MESSAGES, retries=0)
    assert seen[0]["body"]["sim"] == {"latency_ms": 5}


def test_an_http_error_names_the_status_and_the_endpoints_message() -> None:
    with serving() as server:
        url = base_url(server)
        with pytest.raises(ModelError) as caught:
            chat(ModelSpec("openai", "no-such-model", url), MESSAGES, retries=0)
    message = str(caught.value)
    assert f"the model endpoint {url} answered HTTP 404 for no-such-model" in message
    assert "does not exist on the FRLM simulated model server" in message
    assert message.endswith("; check the model's name and the endpoint's URL")


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (429, "the endpoint is limiting the rate: send fewer sub-queries at once"),
        (503, "the server failed: see its log, or try again later"),
        (401, "check the API key (FRLM_API_KEY or OPENAI_API_KEY)"),
    ],
)
def test_an_http_error_says_what_to_do(status: int, says: str) -> None:
    """It said what happened ("answered HTTP 429 ...: slow down"), not what to do (a
    review)."""
    with endpoint(lambda _: (status, b'{"error": {"message": "no"}}')) as (url, _):
        with pytest.raises(ModelError) as caught:
            chat(ModelSpec("openai", "m", url), MESSAGES, retries=0)
    assert f"answered HTTP {status} for m: no; " in str(caught.value)
    assert says in str(caught.value)


def test_a_server_error_is_retried_with_the_clients_backoff() -> None:
    answers = iter([(500, b'{"error": {"message": "busy"}}'), (200, completion("ok"))])
    with endpoint(lambda _: next(answers)) as (url, seen):
        reply = chat(ModelSpec("openai", "m", url), MESSAGES, retries=1)
    assert reply.text == "ok"
    assert len(seen) == 2
    assert seen[1]["headers"]["x-stainless-retry-count"] == "1"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"<html>not json</html>", "answered garbage"),
        (b'{"object": "list", "data": []}', "is not a chat completion"),
        (json.dumps({"choices": [{"message": {"content": None}}]}).encode(), "no text content"),
    ],
)
def test_a_reply_that_is_not_a_chat_completion_is_a_clear_error(body: bytes, says: str) -> None:
    with endpoint(lambda _: (200, body)) as (url, _):
        with pytest.raises(ModelError, match=says) as caught:
            chat(ModelSpec("openai", "m", url), MESSAGES, retries=0)
    assert url in str(caught.value)


def _with_usage(prompt: object, completion_tokens: object) -> bytes:
    reply = json.loads(completion("4"))
    reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens}
    return json.dumps(reply).encode()


@pytest.mark.parametrize(
    ("prompt", "completion_tokens", "says"),
    [
        (10**15, 10**15, "usage.prompt_tokens = 1000000000000000, not a token count"),
        (-1_000_000, -500_000, "usage.prompt_tokens = -1000000, not a token count"),
        (7, "many", "usage.completion_tokens = many, not a token count"),
        (7, 2.5, "usage.completion_tokens = 2.5, not a token count"),
        (7, "\u00b2", "usage.completion_tokens = \u00b2, not a token count"),  # isdigit, not int
    ],
)
def test_usage_that_is_no_token_count_is_the_endpoints_error(
    prompt: object, completion_tokens: object, says: str
) -> None:
    """A root reply claiming 10**15 tokens wrote a cost the runs list could not read back,
    and a negative count failed the run as an internal error (a review)."""
    with endpoint(lambda _: (200, _with_usage(prompt, completion_tokens))) as (url, _):
        with pytest.raises(ModelError, match=says) as caught:
            chat(ModelSpec("openai", "m", url), MESSAGES, retries=0)
    assert url in str(caught.value) and "counts wrongly" in str(caught.value)


def test_usage_given_as_whole_floats_or_digit_strings_is_read() -> None:
    with endpoint(lambda _: (200, _with_usage(7.0, "3"))) as (url, _):
        reply = chat(ModelSpec("openai", "m", url), MESSAGES, retries=0)
    assert (reply.tokens_in, reply.tokens_out) == (7, 3)


def test_a_replay_job_answers_from_the_reply_it_carries_not_the_cassette(monkeypatch) -> None:
    """A full replay's job carries its recorded reply: the worker never loads the cassette
    for it. A reply for another request is not used: the cassette answers (or refuses)."""
    from traces import cassette
    from workers.backends import cassette_spec

    loads: list[str] = []
    monkeypatch.setattr(cassette, "recordings", lambda run_id: loads.append(run_id) or {})
    cassette.cassette_forget()
    spec = cassette_spec({"kind": "sim", "model": "m"}, "r-none", live=None)
    messages = [{"role": "user", "content": "q"}]
    carried = {
        "text": "recorded answer",
        "tokens_in": 3,
        "tokens_out": 2,
        "cost": 0.001,
        "ms": 12.0,
        "request_hash": cassette.request_hash("m", messages),
    }
    reply = chat(spec, messages, recorded=carried)
    assert (reply.text, reply.tokens_in, reply.replayed) == ("recorded answer", 3, True)
    assert loads == []
    with pytest.raises(ModelError, match="left the recorded path"):
        chat(spec, [{"role": "user", "content": "other"}], recorded=carried)
    assert loads == ["r-none"]
    cassette.cassette_forget()


@pytest.mark.parametrize("text", ["Grüße, 東京 🚀", "a lone surrogate \ud800 stays"])
def test_the_body_goes_as_json_and_any_text_arrives_as_written(text: str) -> None:
    """The request is encoded by FRLM (orjson, the standard library for what it refuses)
    and sent as it is by the client: it must still say it is JSON and carry every text."""
    messages = [{"role": "user", "content": text}]
    with endpoint(lambda _: (200, completion(text))) as (url, seen):
        reply = chat(ModelSpec("openai", "m", url), messages, retries=0)
    (request,) = seen
    assert request["headers"]["content-type"] == "application/json"
    assert request["body"]["messages"] == messages
    assert reply.text == text


def test_a_commands_endpoint_goes_to_its_openai_model_only(settings) -> None:
    """`frlm_run --worker-model openai:x --base-url URL` left the root on the simulated
    model, but sent it to URL too (a review): the run failed at its first root turn."""
    from workers.backends import command_models

    url = "http://127.0.0.1:11434/v1"
    root, worker = command_models("sim", "openai:qwen3", base_url=url, model=None)
    assert (root.kind, root.base_url) == ("sim", settings.FRLM_SIM_URL)
    assert (worker.kind, worker.model, worker.base_url) == ("openai", "qwen3", url)
    root, worker = command_models("openai", None, base_url=url, model="m")
    assert (root.model, root.base_url, worker) == ("m", url, None)
    root, _ = command_models("", "openai:qwen3", base_url=url, model=None)  # empty is sim
    assert (root.kind, root.base_url) == ("sim", settings.FRLM_SIM_URL)


def test_a_slow_endpoint_is_said_to_be_slow_not_unreachable() -> None:
    """A reply past the timeout was "cannot reach the model endpoint ...; check --base-url
    and that the server is up", for a server that was up (a review)."""
    import time

    def slow(_):
        time.sleep(1.0)
        return 200, completion("late")

    with endpoint(slow) as (url, _):
        with pytest.raises(ModelError) as caught:
            chat(ModelSpec("openai", "m", url), MESSAGES, timeout=0.2, retries=0)
    message = str(caught.value)
    assert f"the model endpoint {url} did not answer within 0.2 s (tried 1 time(s))" in message
    assert "FRLM_MODEL_TIMEOUT_S for the root model" in message and "cannot reach" not in message
