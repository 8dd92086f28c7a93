"""The simulated model, driven through its real HTTP API with the real `openai` client,
and its root programs run for real against the worker model's logic."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from runs.sandbox.lazytext import LazyText
from runs.taskgen import make_task
from workers.fragments import fill
from workers.sim import ROOT_MODEL, WORKER_MODEL, ChatMessage
from workers.sim.profile import Profile, ProfileError, decide, parse_profile
from workers.sim.reader import answer_prompt
from workers.sim.root import root_reply
from workers.sim.server import SimServer, base_url, serving

NEEDLE_QUESTION = (
    "What is the special magic number for crimson-harbor mentioned in the provided text?"
)
NEEDLE_PROMPT = (
    "Find the special magic number for 'crimson-harbor' in the text below. Reply with the "
    "number only, or NONE if it is not there.\n\nTEXT:\n"
)


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with serving() as running:
        yield running


@pytest.fixture(scope="module")
def client(server: SimServer) -> OpenAI:
    # No retries: a simulated failure must reach the test as it happened.
    return OpenAI(base_url=base_url(server), api_key="sim", max_retries=0)


def _ask(client: OpenAI, model: str, messages: list[ChatMessage], **sim: Any) -> str:
    response = client.chat.completions.create(
        model=model, messages=messages, extra_body={"sim": sim}
    )
    return response.choices[0].message.content or ""


def _worker(client: OpenAI, prompt: str, **sim: Any) -> str:
    return _ask(client, WORKER_MODEL, [{"role": "user", "content": prompt}], **sim)


def _root_messages(
    question: str, turns: tuple[tuple[str, str], ...] = (), max_batch: int = 16
) -> list[ChatMessage]:
    system = (
        "You answer questions about a long text with a Python REPL. The variable `context` "
        "holds the text; call llm_query, llm_query_batched and FINAL.\n"
        "Context: str of 800,000 characters (about 200,000 tokens).\n"
        f"Limits: max_batch={max_batch}, max_subqueries=64, depth=0/1.\n"
    )
    messages: list[ChatMessage] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Question: {question}"},
    ]
    for cell, (reply, output) in enumerate(turns, start=1):
        messages.append({"role": "assistant", "content": reply})
        messages.append(
            {"role": "user", "content": f"REPL output (cell {cell}):\n```\n{output}\n```"}
        )
    return messages


def _code(reply: str) -> str:
    blocks = re.findall(r"```repl\n(.*?)\n```", reply, re.DOTALL)
    assert len(blocks) == 1, reply
    return blocks[0]


def _run(
    code: str,
    context: str,
    batched: Callable[[list[str]], list[str]],
    query: Callable[[str], str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Execute a root program the way a REPL would, returning its stdout and namespace: the
    context is a lazy text over a file, and each prompt's fragments are read in, as the
    worker does, before `batched` sees it."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        fh.write(context)
    namespace: dict[str, Any] = {
        "context": LazyText(fh.name),
        "llm_query_batched": lambda prompts: batched([fill(p)[0] for p in prompts]),
        "llm_query": lambda prompt: (query or answer_prompt)(fill(prompt)[0]),
    }
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<root program>", "exec"), namespace)
    return out.getvalue(), namespace


def _reading_workers(prompts: list[str]) -> list[str]:
    return [answer_prompt(prompt) for prompt in prompts]


# --- the HTTP API ------------------------------------------------------------------------


def test_it_lists_both_models(client: OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [ROOT_MODEL, WORKER_MODEL]
    assert {m.owned_by for m in models.data} == {"frlm-simulated"}


def test_it_replies_with_a_labelled_chat_completion(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=WORKER_MODEL, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert response.object == "chat.completion"
    assert response.system_fingerprint == "frlm-simulated"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None
    assert response.usage.prompt_tokens == 3  # ceil(10 characters / 4)


def test_it_rejects_an_unknown_model_with_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 404
    assert raised.value.body["code"] == "model_not_found"


def test_it_rejects_a_malformed_body_with_400(server: SimServer) -> None:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=5)
    for body in (b"{not json", json.dumps({"model": WORKER_MODEL}).encode()):
        connection.request(
            "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 400
        assert error["type"] == "invalid_request_error"
    connection.close()


def test_it_refuses_streaming(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="streaming is not supported"):
        client.chat.completions.create(
            model=WORKER_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )


def test_it_refuses_an_unknown_sim_field(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="unknown sim field 'latency'"):
        _worker(client, "hi", latency=5)


def test_it_fails_with_http_500_at_failure_rate_one(client: OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as raised:
        _worker(client, "hi", failure_rate=1.0)
    assert raised.value.status_code == 500
    assert raised.value.body["message"] == "simulated worker failure"
    assert raised.value.body["type"] == "server_error"


def test_it_honours_the_latency(client: OpenAI) -> None:
    started = time.perf_counter()
    _worker(client, "a slow hello", latency_ms=200, spread=0)
    assert time.perf_counter() - started >= 0.19


def test_it_serves_64_slow_requests_at_once(client: OpenAI) -> None:
    def one(i: int) -> str:
        return _worker(client, f"request {i}", latency_ms=200, spread=0)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=64) as pool:
        replies = list(pool.map(one, range(64)))
    # One after another this would take 12.8 s; at once, 0.2 s and the clients' own CPU,
    # which a loaded 2-core machine stretched past 2 s (CI, with another suite running).
    assert time.perf_counter() - started < 6.4
    assert len(replies) == 64


def test_it_gives_the_same_reply_and_latency_to_the_same_request(client: OpenAI) -> None:
    sim = {"latency_ms": 20, "spread": 0.8, "straggler_rate": 0.5, "seed": 11}
    messages: list[ChatMessage] = [{"role": "user", "content": NEEDLE_PROMPT + "Nothing."}]
    seen = set()
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=WORKER_MODEL, messages=messages, extra_body={"sim": sim}
        )
        completion = raw.parse()
        seen.add(
            (
                completion.id,
                completion.choices[0].message.content,
                raw.headers["X-FRLM-Sim-Delay-Ms"],
                raw.headers["X-FRLM-Sim-Straggler"],
            )
        )
    assert len(seen) == 1


def test_it_draws_independently_per_seed_and_attempt() -> None:
    messages: list[ChatMessage] = [{"role": "user", "content": "hi"}]
    base = parse_profile({"failure_rate": 0.5, "latency_ms": 100, "spread": 1.0})
    draws = [decide(parse_profile({"attempt": n}, base), WORKER_MODEL, messages) for n in range(20)]
    assert {d.fail for d in draws} == {True, False}  # a retry with a new attempt may pass
    assert len({d.delay_s for d in draws}) == 20
    assert decide(base, WORKER_MODEL, messages) == decide(base, WORKER_MODEL, messages)


def test_it_makes_a_straggler_slower_by_the_factor() -> None:
    messages: list[ChatMessage] = [{"role": "user", "content": "hi"}]
    decision = decide(
        Profile(latency_ms=50, straggler_rate=1.0, straggler_factor=10), WORKER_MODEL, messages
    )
    assert decision.straggler
    assert decision.delay_s == pytest.approx(0.5)


# --- the worker model ----------------------------------------------------------------------


def test_it_answers_a_needle_prompt_from_the_fragment(client: OpenAI) -> None:
    text = (
        "The train was late. One of the special magic numbers for crimson-harbor-east is: "
        "1111111. One of the special magic numbers for crimson-harbor is: 4827361. "
        "One of the special magic numbers for amber-falcon is: 2222222. The end."
    )
    assert _worker(client, NEEDLE_PROMPT + text) == "4827361"


def test_it_answers_none_when_only_distractors_are_in_the_fragment(client: OpenAI) -> None:
    text = (
        "One of the special magic numbers for crimson-meadow is: 1111111. Rain fell. "
        "One of the special magic numbers for dark-crimson-harbor is: 2222222."
    )
    assert _worker(client, NEEDLE_PROMPT + text) == "NONE"


def test_it_lies_with_a_plausible_wrong_number_at_lie_rate_one(client: OpenAI) -> None:
    prompt = NEEDLE_PROMPT + "One of the special magic numbers for crimson-harbor is: 4827361."
    lie = _worker(client, prompt, lie_rate=1.0)
    assert re.fullmatch(r"\d{7}", lie)
    assert lie != "4827361"
    assert _worker(client, prompt, lie_rate=1.0) == lie


def test_it_answers_a_generic_question_with_the_most_relevant_sentence(client: OpenAI) -> None:
    prompt = (
        "Answer the question using only the excerpt below. Reply NONE if the excerpt does "
        "not help.\n\nQUESTION: Which river flooded the old mill in spring?\n\nEXCERPT:\n"
        "The town has a market. The river Avon flooded the old mill in spring. "
        "The mill was later rebuilt."
    )
    assert _worker(client, prompt) == "The river Avon flooded the old mill in spring."


def test_it_answers_none_when_the_excerpt_shares_no_words(client: OpenAI) -> None:
    prompt = (
        "Answer the question using only the excerpt below. Reply NONE if the excerpt does "
        "not help.\n\nQUESTION: Who painted the ceiling?\n\nEXCERPT:\nBees hum in June."
    )
    assert _worker(client, prompt) == "NONE"


def test_it_combines_partial_answers_by_majority(client: OpenAI) -> None:
    combine = (
        "Combine these partial answers into one answer to the question.\n\n"
        "QUESTION: Who won?\n\nPARTIAL ANSWERS:\n"
    )
    assert _worker(client, combine + "- Ada\n- Bob\n- Bob\n- Ada\n- Bob") == "Bob"
    assert _worker(client, combine + "- Ada\n- Bob") == "Ada"  # a tie goes to the first


# --- the root model -------------------------------------------------------------------------


def test_it_writes_a_compiling_needle_program_on_turn_one(client: OpenAI) -> None:
    reply = _ask(client, ROOT_MODEL, _root_messages(NEEDLE_QUESTION))
    code = _code(reply)
    compile(code, "<turn 1>", "exec")
    assert "llm_query_batched(" in code
    assert "'crimson-harbor'" in code


def test_it_returns_final_var_on_turn_two(client: OpenAI) -> None:
    first = _ask(client, ROOT_MODEL, _root_messages(NEEDLE_QUESTION))
    output = "1 of 16 chunks mention the key; failed: 0; answer: 4827361"
    reply = _ask(client, ROOT_MODEL, _root_messages(NEEDLE_QUESTION, ((first, output),)))
    assert _code(reply) == 'FINAL_VAR("answer")'


def test_it_says_not_found_when_no_chunk_mentions_the_key() -> None:
    first = root_reply(_root_messages(NEEDLE_QUESTION))
    output = "0 of 16 chunks mention the key; failed: 2; answer: None"
    reply = root_reply(_root_messages(NEEDLE_QUESTION, ((first, output),)))
    assert _code(reply) == 'FINAL("The key was not found in the context.")'


def test_it_retries_once_with_a_smaller_program_after_an_error() -> None:
    first = root_reply(_root_messages(NEEDLE_QUESTION))
    error = 'Traceback (most recent call last):\n  File "<cell>"\nRuntimeError: budget exceeded'
    retry = root_reply(_root_messages(NEEDLE_QUESTION, ((first, error),)))
    code = _code(retry)
    compile(code, "<retry>", "exec")
    assert "context.find(key)" in code

    context = "filler. " * 5000 + "One of the special magic numbers for crimson-harbor is: 4827361."
    output, namespace = _run(code, context, _reading_workers)
    assert namespace["answer"] == "4827361"

    again = root_reply(_root_messages(NEEDLE_QUESTION, ((first, error), (retry, error))))
    assert again.startswith("FINAL(") and "RuntimeError: budget exceeded" in again
    assert "```" not in again


def test_it_gives_a_final_answer_when_asked() -> None:
    first = root_reply(_root_messages(NEEDLE_QUESTION))
    messages = _root_messages(
        NEEDLE_QUESTION, ((first, "1 of 16 chunks mention the key; failed: 0; answer: 4827361"),)
    )
    messages.append({"role": "assistant", "content": "Let me check again.\n```repl\nx = 1\n```"})
    messages.append({"role": "user", "content": "Out of turns: give your final answer now."})
    assert root_reply(messages) == "FINAL(4827361)"


def test_a_turn_that_says_not_to_answer_yet_is_no_call_for_the_final_answer() -> None:
    # The official RLM library's first turn ends "do not provide a final answer yet": read
    # as the conductor's last nudge, it got FINAL() instead of the question's program
    # (bench/peer.py runs that library against this server).
    question = "Answer the following: Run this:\n```repl\nprint(1)\n```\n"
    messages = [
        {"role": "system", "content": "You are an RLM."},
        {"role": "user", "content": question},
        {
            "role": "user",
            "content": "You have not seen your context yet. Look at the context first; do not "
            "provide a final answer yet.\n\nTurn 1/30:",
        },
    ]
    assert _code(root_reply(messages)) == "print(1)"
    messages.append({"role": "assistant", "content": "```repl\nprint(1)\n```"})
    messages.append({"role": "user", "content": "Out of turns: give your final answer now."})
    assert root_reply(messages).startswith("FINAL(")


def test_it_replays_scripted_blocks_then_returns_the_last_output_line(client: OpenAI) -> None:
    question = (
        "Run this:\n```repl\nx = len(context)\nprint(x)\n```\n"
        "and then:\n```repl\nprint('half', x // 2)\n```\n"
    )
    first = _ask(client, ROOT_MODEL, _root_messages(question))
    assert _code(first) == "x = len(context)\nprint(x)"
    second = _ask(client, ROOT_MODEL, _root_messages(question, ((first, "800000"),)))
    assert _code(second) == "print('half', x // 2)"
    done = _ask(
        client, ROOT_MODEL, _root_messages(question, ((first, "800000"), (second, "half 400000\n")))
    )
    assert done == "FINAL(half 400000)"


def test_it_embeds_a_hostile_question_as_data_not_code() -> None:
    question = 'Who said """hi""" or \'\'\'bye\'\'\' \\ {x}\nand then print("pwned")?'
    code = _code(root_reply(_root_messages(question)))
    prompts: list[str] = []

    def batched(batch: list[str]) -> list[str]:
        prompts.extend(batch)
        return ["NONE"] * len(batch)

    output, _ = _run(code, "some text", batched)
    assert "pwned" not in output
    assert f"QUESTION: {question}\n" in prompts[0]


def test_it_answers_a_generic_question_end_to_end() -> None:
    question = "Which river flooded the old mill in spring?"
    code = _code(root_reply(_root_messages(question)))
    context = "The town has a market. " * 3000 + "The river Avon flooded the old mill in spring. "
    output, namespace = _run(code, context + "The end. " * 3000, _reading_workers)
    assert namespace["answer"] == "The river Avon flooded the old mill in spring."
    assert output.endswith("answer: The river Avon flooded the old mill in spring.\n")


def test_it_never_sends_more_chunks_than_max_batch() -> None:
    code = _code(root_reply(_root_messages(NEEDLE_QUESTION, max_batch=7)))
    sizes: list[int] = []
    chunks: list[str] = []

    def batched(batch: list[str]) -> list[str]:
        sizes.append(len(batch))
        chunks.extend(prompt.removeprefix(NEEDLE_PROMPT) for prompt in batch)
        return ["NONE"] * len(batch)

    context = "".join(f"{i:07d} " for i in range(500_000))  # 4 MB
    _run(code, context, batched)
    assert sizes == [7]
    # Neighbouring chunks overlap, so a needle cut by one boundary is whole in one chunk.
    assert all(chunks[i][-200:] == chunks[i + 1][:200] for i in range(6))
    assert "".join(chunk[:-200] for chunk in chunks[:-1]) + chunks[-1] == context


def test_it_finds_the_needle_in_a_200k_token_context() -> None:
    task = make_task("sniah", 200_000, seed=3)
    code = _code(root_reply(_root_messages(task.question)))
    output, namespace = _run(code, task.context_text(), _reading_workers)
    assert namespace["answer"] == task.expected_answer
    assert output.strip().endswith(f"answer: {task.expected_answer}")
    assert "failed: 0" in output


def test_it_counts_failed_subqueries_and_still_answers() -> None:
    task = make_task("sniah", 200_000, seed=4)
    key = task.question.split(" for ")[1].split()[0]

    def flaky(prompts: list[str]) -> list[str]:
        # Every sub-query whose fragment lacks the key times out.
        return [
            answer_prompt(p) if key + " is:" in p else f"[frlm:timeout] sub-query {i} timed out"
            for i, p in enumerate(prompts)
        ]

    code = _code(root_reply(_root_messages(task.question)))
    output, namespace = _run(code, task.context_text(), flaky)
    assert namespace["answer"] == task.expected_answer
    # The needle sits in one chunk, or in two when it falls in an overlap.
    counts = re.search(r"(\d+) of 16 chunks mention the key; failed: (\d+);", output)
    assert counts is not None, output
    assert int(counts[1]) in (1, 2)
    assert int(counts[1]) + int(counts[2]) == 16


# --- the management command ----------------------------------------------------------------


def test_it_runs_as_a_command_and_stops_cleanly_on_sigterm() -> None:
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "manage.py", "frlm_simserver", "--port", "0"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        match = re.fullmatch(
            r"simulated model server \(FRLM simulated model, not a real LLM\) listening on "
            r"(http://127\.0\.0\.1:\d+/v1)\n",
            line,
        )
        assert match, line
        models = OpenAI(base_url=match[1], api_key="sim", max_retries=0).models.list()
        assert [m.id for m in models.data] == [ROOT_MODEL, WORKER_MODEL]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_it_makes_colluding_liars_tell_the_same_lie_and_independent_ones_not():
    messages: list[ChatMessage] = [{"role": "user", "content": "Where?\nStation 1 is north."}]
    colluders = [Profile(lie_rate=1.0, collude=1.0, seed=s) for s in (1, 2, 3)]
    loners = [Profile(lie_rate=1.0, seed=s) for s in (1, 2, 3)]
    shared = {decide(p, WORKER_MODEL, messages).lie_seed for p in colluders}
    apart = {decide(p, WORKER_MODEL, messages).lie_seed for p in loners}
    assert len(shared) == 1 and len(apart) == 3
    with pytest.raises(ProfileError, match="collude"):
        parse_profile({"collude": 2})
