"""`manage.py frlm_export` and `frlm_import` as a user types them, against the real stack:
OTLP (checked with the official protobuf schema), JSON lines and Parquet out; OTLP and
rlms trajectory logs in."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from runs.models import Run
from tests.helpers import endpoint, finish, launch, named, scripted, trace
from traces import blobs, store
from traces.otlp import to_otlp
from traces.otlp_import import from_otlp
from traces.schema import ARROW_SCHEMA
from traces.store import SpanNode

pytestmark = [pytest.mark.stack]

NEEDLE = (
    "Filler. " * 50
    + "One of the special magic numbers for teal-otter is: 4417001. "
    + "More. " * 50
)
PROMPT = (
    "Find the special magic number for 'teal-otter' in the text below. Reply with the number "
    f"only, or NONE if it is not there.\n\nTEXT:\n{NEEDLE}"
)
_real_runs: dict[str, str] = {}


def manage(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def real_run(venues) -> str:
    """A finished run with a sub-query, made once; its stored trace outlives the test
    database rows, and exports read only the trace."""
    if "id" not in _real_runs:
        run = finish(launch(question=scripted(f"r = llm_query({PROMPT!r})\nFINAL(r)")))
        assert run.status == "succeeded", run.error
        trace(run)
        _real_runs["id"] = run.id
        _real_runs["answer"] = run.answer
    return _real_runs["id"]


def stored_runs() -> set[str]:
    events = store.events_dir()
    return {p.name for p in events.iterdir()} if events.exists() else set()


def otlp_attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {item["key"]: next(iter(item["value"].values())) for item in items}


# --- export -------------------------------------------------------------------------------


def test_it_exports_a_run_as_otlp_that_the_protobuf_schema_accepts(real_run, subprocess_env):
    done = manage(subprocess_env, "frlm_export", real_run, "--format", "otlp")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    json_format.Parse(json.dumps(doc), ExportTraceServiceRequest())
    # OTLP/JSON writes ids in hex where protobuf's JSON mapping reads base64: as bytes, a
    # trace id must be 16 long and a span id 8.
    as_bytes = json.loads(json.dumps(doc))
    for span in as_bytes["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            if span.get(key):
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        span.pop("links", None)
    message = json_format.Parse(json.dumps(as_bytes), ExportTraceServiceRequest())
    proto_spans = message.resource_spans[0].scope_spans[0].spans
    assert {len(s.trace_id) for s in proto_spans} == {16}
    assert {len(s.span_id) for s in proto_spans} == {8}

    resource = otlp_attrs(doc["resourceSpans"][0]["resource"]["attributes"])
    assert resource["service.name"] == "frlm" and resource["frlm.run_id"] == real_run
    assert resource["frlm.open_spans"] == "0"
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    events = store.read_events(real_run)
    assert len(spans) == len({e["span_id"] for e in events if e["phase"] == "end"})
    by_name = {otlp_attrs(s["attributes"])["frlm.event_name"]: s for s in spans}
    execute = by_name["SubQuery.Execute"]
    attrs = otlp_attrs(execute["attributes"])
    assert execute["kind"] == 3 and execute["name"] == "chat frlm-sim-worker"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "frlm-sim-worker"
    assert int(attrs["gen_ai.usage.input_tokens"]) > 0
    assert int(attrs["gen_ai.usage.output_tokens"]) > 0
    assert attrs["frlm.end_payload"] == "4417001" and attrs["frlm.venue"] in {"local", "edge"}
    decode = otlp_attrs(by_name["Run.Decode"]["attributes"])
    assert decode["gen_ai.request.model"] == "frlm-sim-root"
    root = by_name["Run.Init"]
    assert "parentSpanId" not in root and root["kind"] == 1 and root["status"]["code"] == 1
    assert int(root["endTimeUnixNano"]) > int(root["startTimeUnixNano"])
    assert "Run.Done" in [e["name"] for e in root["events"]]
    submit = by_name["SubQuery.Submit"]
    assert execute["parentSpanId"] == submit["spanId"]
    assert "Receipt.Emit" in [e["name"] for e in submit["events"]]  # an instant: a span event


def test_it_exports_span_kinds_messages_tokens_and_cost_for_llm_viewers(real_run, subprocess_env):
    done = manage(subprocess_env, "frlm_export", real_run)
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        attrs = otlp_attrs(span["attributes"])
        by_name.setdefault(attrs["frlm.event_name"], []).append(attrs)
    assert all("openinference.span.kind" in otlp_attrs(s["attributes"]) for s in spans)
    kinds = {name: {a["openinference.span.kind"] for a in found} for name, found in by_name.items()}
    assert kinds["Run.Init"] == {"AGENT"} and kinds["Run.Decode"] == {"LLM"}
    assert kinds["SubQuery.Execute"] == {"LLM"} and kinds["Repl.Exec"] == {"TOOL"}
    assert kinds["SubQuery.Submit"] == {"CHAIN"}

    root = by_name["Run.Init"][0]
    question = scripted(f"r = llm_query({PROMPT!r})\nFINAL(r)")
    assert root["input.value"] == question and root["langfuse.trace.input"] == question
    assert root["output.value"] == _real_runs["answer"] == root["langfuse.trace.output"]
    assert root["langfuse.observation.type"] == "agent"
    assert root["session.id"] == real_run  # Phoenix's Sessions tab lists the run by it
    assert all("session.id" not in a for found in by_name.values() for a in found if a is not root)

    decode = by_name["Run.Decode"][0]
    assert decode["llm.input_messages.0.message.role"] == "system"
    assert decode["llm.input_messages.1.message.role"] == "user"
    assert question in decode["llm.input_messages.1.message.content"]
    assert json.loads(decode["input.value"])["messages"][1]["content"].endswith(question)
    assert decode["input.mime_type"] == "application/json"
    assert "llm_query" in decode["llm.output_messages.0.message.content"]
    assert decode["output.value"] == decode["llm.output_messages.0.message.content"]
    genai_in = json.loads(decode["gen_ai.input.messages"])
    assert genai_in[1]["role"] == "user" and genai_in[1]["parts"][0]["type"] == "text"
    assert decode["llm.model_name"] == "frlm-sim-root"

    execute = by_name["SubQuery.Execute"][0]
    assert execute["langfuse.observation.type"] == "generation"
    assert execute["llm.input_messages.0.message.content"] == PROMPT
    assert execute["llm.output_messages.0.message.content"] == "4417001"
    assert json.loads(execute["gen_ai.output.messages"])[0]["parts"][0]["content"] == "4417001"
    prompt, completion = (
        int(execute["llm.token_count.prompt"]),
        int(execute["llm.token_count.completion"]),
    )
    assert prompt > 0 and completion > 0
    assert int(execute["llm.token_count.total"]) == prompt + completion
    assert int(execute["gen_ai.usage.input_tokens"]) == prompt
    assert json.loads(execute["langfuse.observation.usage_details"]) == {
        "input": prompt,
        "output": completion,
        "total": prompt + completion,
    }
    cost = execute["frlm.cost"]
    assert cost > 0 and execute["llm.cost.total"] == cost == execute["gen_ai.usage.cost"]
    assert json.loads(execute["langfuse.observation.cost_details"]) == {"total": cost}

    tool = by_name["Repl.Exec"][0]
    assert tool["tool.name"] == "python" and "llm_query" in tool["input.value"]


def test_it_pushes_the_run_to_an_otlp_http_collector_as_protobuf(real_run, subprocess_env):
    def collect(request: dict[str, Any]) -> tuple[int, bytes]:
        return 200, b"{}"

    with endpoint(collect) as (url, seen):
        base = url.removesuffix("/v1")
        env = {**subprocess_env, "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=frlm%20tests"}
        done = manage(
            env,
            "frlm_export",
            real_run,
            "--otlp-endpoint",
            base,
            "--otlp-header",
            "Authorization=Basic cGs6c2s=",
        )
    assert done.returncode == 0, done.stderr
    assert len(seen) == 1
    request = seen[0]
    assert request["path"] == "/v1/traces"
    assert request["headers"]["content-type"] == "application/x-protobuf"
    assert request["headers"]["authorization"] == "Basic cGs6c2s="
    assert request["headers"]["x-tenant"] == "frlm tests"
    message = ExportTraceServiceRequest()
    message.ParseFromString(request["raw"])
    spans = message.resource_spans[0].scope_spans[0].spans
    events = store.read_events(real_run)
    assert len(spans) == len({e["span_id"] for e in events if e["phase"] == "end"})
    assert f"pushed {len(spans)} spans" in done.stdout
    ids = {s.span_id for s in spans}
    assert all(len(s.trace_id) == 16 for s in spans)
    assert all(not s.parent_span_id or s.parent_span_id in ids for s in spans)
    llm = [s for s in spans if s.kind == s.SPAN_KIND_CLIENT]
    values = {a.key: a.value for a in llm[0].attributes}
    assert values["openinference.span.kind"].string_value == "LLM"
    assert values["llm.token_count.prompt"].int_value > 0


def hedged_run_events() -> list[dict[str, Any]]:
    """A run whose sub-query was hedged: the losing copy's worker ended its model call after
    the sub-query had settled and after the run had ended, as stragglers do."""
    ms = 1_000_000
    t0 = 1_700_000_000_000_000_000

    def event(seq: int, span: str, parent: str | None, name: str, phase: str, at: int, **kw):
        return {
            "seq": seq,
            "span_id": span,
            "parent_id": parent,
            "name": name,
            "phase": phase,
            "ts": t0 + at * ms,
            "status": kw.pop("status", "ok"),
            "links": [],
            "attrs": kw.pop("attrs", {}),
            "payload_ref": None,
            **kw,
        }

    root, submit, first, hedge = "a" * 16, "b" * 16, "c" * 16, "d" * 16
    return [
        event(1, root, None, "Run.Init", "start", 0, attrs={"question": "q?"}),
        event(2, submit, root, "SubQuery.Submit", "start", 10),
        event(3, first, submit, "SubQuery.Execute", "start", 12, attrs={"sq_id": "s1"}),
        event(4, hedge, submit, "SubQuery.Execute", "start", 200, attrs={"sq_id": "s1h"}),
        event(5, hedge, submit, "SubQuery.Execute", "end", 250, tokens_in=5, tokens_out=1),
        event(
            6,
            None,
            submit,
            "SubQuery.Cancel",
            "instant",
            251,
            status="cancelled",
            attrs={"sq_id": "s1", "reason": "hedged: the hedge s1h answered first"},
        ),
        event(7, submit, root, "SubQuery.Submit", "end", 252),
        event(8, root, None, "Run.Init", "end", 371),
        event(9, first, submit, "SubQuery.Execute", "end", 422, tokens_in=5, tokens_out=1),
    ]


def test_it_marks_a_hedge_loser_and_clips_it_into_its_parent():
    doc = to_otlp("hedged", hedged_run_events(), payload_text=None)
    spans = {
        otlp_attrs(s["attributes"])["frlm.span_id"]: s
        for s in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    }
    root, submit, loser, winner = (spans[c * 16] for c in "abcd")
    assert int(loser["endTimeUnixNano"]) == int(submit["endTimeUnixNano"])
    assert max(int(s["endTimeUnixNano"]) for s in spans.values()) == int(root["endTimeUnixNano"])
    attrs = otlp_attrs(loser["attributes"])
    assert attrs["frlm.hedge_loser"] is True and attrs["frlm.clipped"] is True
    assert attrs["frlm.cancel_reason"].startswith("hedged")
    assert int(attrs["frlm.recorded_end_ns"]) == 1_700_000_000_422_000_000
    assert loser["status"]["code"] == 2 and "hedged" in loser["status"]["message"]
    assert attrs["langfuse.observation.level"] == "WARNING"
    assert "frlm.hedge_loser" not in otlp_attrs(winner["attributes"])
    assert winner["status"]["code"] == 1
    # Imported back, the loser keeps the times it recorded.
    imported = {s.key: s for s in from_otlp(doc).spans}
    assert imported["c" * 16].end_ns == 1_700_000_000_422_000_000


def test_it_says_why_a_push_failed(real_run, subprocess_env):
    with endpoint(lambda request: (401, b'{"message": "bad key"}')) as (url, _):
        refused = manage(subprocess_env, "frlm_export", real_run, "--otlp-endpoint", url)
    assert refused.returncode == 1
    assert "answered 401" in refused.stderr and "bad key" in refused.stderr
    bad = manage(subprocess_env, "frlm_export", real_run, "--otlp-endpoint", "localhost:4318")
    assert bad.returncode == 1 and "http(s) URL" in bad.stderr
    header = manage(
        subprocess_env,
        "frlm_export",
        real_run,
        "--otlp-endpoint",
        "http://127.0.0.1:9",
        "--otlp-header",
        "no-equals-sign",
    )
    assert header.returncode == 1 and "KEY=VALUE" in header.stderr


def test_it_exports_jsonl_and_parquet_with_one_record_per_event(real_run, subprocess_env, tmp_path):
    events = store.read_events(real_run)
    lines = manage(subprocess_env, "frlm_export", real_run, "--format", "jsonl")
    assert lines.returncode == 0, lines.stderr
    rows = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [r["seq"] for r in rows] == [e["seq"] for e in events]
    assert {r["run_id"] for r in rows} == {real_run}

    path = tmp_path / "trace.parquet"
    done = manage(
        subprocess_env, "frlm_export", real_run, "--format", "parquet", "--output", str(path)
    )
    assert done.returncode == 0, done.stderr
    table = pq.read_table(path)
    assert table.schema.equals(ARROW_SCHEMA)
    assert table.num_rows == len(events)
    assert table.column("event_id").to_pylist() == [e["event_id"] for e in events]
    assert json.loads(table.column("attrs")[0].as_py()) == events[0]["attrs"]


def test_it_refuses_an_unknown_run_and_parquet_on_stdout(venues, subprocess_env):
    unknown = manage(subprocess_env, "frlm_export", "rnothere0000", "--format", "jsonl")
    assert unknown.returncode != 0
    assert "no trace stored for run 'rnothere0000'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    binary = manage(subprocess_env, "frlm_export", "rnothere0000", "--format", "parquet")
    assert binary.returncode != 0 and "give --output PATH" in binary.stderr


# --- import -------------------------------------------------------------------------------


def shape(nodes: list[SpanNode]) -> list[Any]:
    return [
        (
            n.name,
            n.status,
            n.depth,
            n.tokens_in,
            n.tokens_out,
            [i["name"] for i in n.instants],
            shape(n.children),
        )
        for n in nodes
    ]


def durations(nodes: list[SpanNode]) -> list[int]:
    found: list[int] = []
    for n in nodes:
        found.append((n.end_ns or 0) - (n.start_ns or 0))
        found.extend(durations(n.children))
    return found


def test_it_imports_its_own_otlp_export_as_the_same_span_tree(real_run, subprocess_env, tmp_path):
    path = tmp_path / "export.otlp.json"
    exported = manage(subprocess_env, "frlm_export", real_run, "--output", str(path))
    assert exported.returncode == 0, exported.stderr
    done = manage(subprocess_env, "frlm_import", str(path), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["format"] == "otlp" and result["source_run_id"] == real_run

    imported = Run.objects.get(id=result["run_id"])
    assert imported.status == "succeeded"
    assert imported.answer == _real_runs["answer"] == "4417001"
    assert imported.context_source == Run.Source.IMPORTED
    assert imported.context_path == str(path.resolve())
    assert imported.root_model["kind"] == "imported"
    assert imported.root_model["model"] == "frlm-sim-root"
    assert imported.subqueries == 1 and imported.tokens_in > 0

    before, after = store.span_tree(real_run), store.span_tree(imported.id)
    assert shape(after) == shape(before)
    assert shape(before)[0][0] == "Run.Init"
    for old, new in zip(durations(before), durations(after), strict=True):
        assert abs(old - new) <= 1_000_000
    (execute,) = named(store.read_events(imported.id), "SubQuery.Execute", "end")
    assert blobs.blob_get(execute["payload_ref"]) == "4417001"


def call(model: str, prompt: str, response: str, tokens: tuple[int, int], secs: float) -> dict:
    """One sub-call as rlms logs it (RLMChatCompletion.to_dict)."""
    usage = {"total_calls": 1, "total_input_tokens": tokens[0], "total_output_tokens": tokens[1]}
    return {
        "root_model": model,
        "prompt": prompt,
        "response": response,
        "usage_summary": {"model_usage_summaries": {model: usage}},
        "execution_time": secs,
    }


def block(code: str, secs: float, calls: list[dict], stdout: str = "", stderr: str = "") -> dict:
    result = {"stdout": stdout, "stderr": stderr, "locals": {}, "execution_time": secs}
    return {"code": code, "result": {**result, "rlm_calls": calls}}


def iteration(n: int, at: str, secs: float, response: str, blocks: list, final=None) -> dict:
    return {
        "type": "iteration",
        "iteration": n,
        "timestamp": at,
        "prompt": [{"role": "system", "content": "You are an RLM."}],
        "response": response,
        "code_blocks": blocks,
        "final_answer": final,
        "iteration_time": secs,
    }


def rlms_log() -> list[dict]:
    """A log as rlms writes it: metadata, run context, three root iterations; the second
    runs a batch (one call fails) and a child RLM with its own trajectory."""
    child_call = call("gpt-5-mini", "Check the total: 12 + 9 + 5", "26", (800, 40), 2.4)
    child_call["metadata"] = {
        "run_metadata": {"root_model": "gpt-5-mini", "max_depth": 2, "max_iterations": 5},
        "iterations": [
            iteration(
                1,
                "2026-01-31T11:05:14.300000",
                2.3,
                "```repl\nx = llm_query('sum 12+9+5')\n```",
                [
                    block(
                        "x = llm_query('sum 12+9+5')",
                        0.8,
                        [call("gpt-5-nano", "sum", "26", (30, 2), 0.7)],
                    )
                ],
                final="26",
            )
        ],
    }
    child_call["usage_summary"]["model_usage_summaries"]["gpt-5-nano"] = {
        "total_calls": 1,
        "total_input_tokens": 30,
        "total_output_tokens": 2,
    }
    # llm_query_batched: rlms logs each call with the batch's 1.5 s divided by three.
    batch = [
        call("gpt-5-mini", "Count cities in part 3", "5", (300, 2), 0.5),
        call("gpt-5-mini", "Count cities in part 4", "0", (300, 2), 0.5),
        call(
            "gpt-5-mini", "Count cities in part 5", "Error: LM query failed - timeout", (0, 0), 0.5
        ),
    ]
    return [
        {
            "type": "metadata",
            "timestamp": "2026-01-31T11:05:04.339193",
            "root_model": "gpt-5",
            "max_depth": 2,
            "max_iterations": 10,
            "backend": "openai",
            "backend_kwargs": {"model_name": "gpt-5"},
            "environment_type": "local",
            "environment_kwargs": {},
            "other_backends": None,
        },
        {
            "type": "run_context",
            "timestamp": "2026-01-31T11:05:04.400000",
            "prompt": "Paris, Lyon, ... (the context)",
            "root_prompt": "How many cities are in the list?",
        },
        iteration(
            1,
            "2026-01-31T11:05:10.000000",
            5.0,
            "Let me look.\n```repl\nprint(len(context))\n```\n```repl\na = llm_query(p1)\n```",
            [
                block("print(len(context))", 0.01, [], stdout="1200\n"),
                block(
                    "a = llm_query(p1)\nb = llm_query(p2)",
                    2.0,
                    [
                        call("gpt-5-mini", "Count cities in part 1", "12", (500, 3), 0.9),
                        call("gpt-5-mini", "Count cities in part 2", "9", (400, 2), 1.0),
                    ],
                ),
            ],
        ),
        iteration(
            2,
            "2026-01-31T11:05:16.500000",
            6.0,
            "```repl\nparts = llm_query_batched(ps)\n```\n```repl\nchild = rlm_query(q)\n```",
            [
                block("parts = llm_query_batched(ps)", 1.6, batch),
                block("child = rlm_query(q)", 2.5, [child_call]),
                block("print(oops)", 0.01, [], stderr="NameError: name 'oops' is not defined"),
            ],
        ),
        iteration(3, "2026-01-31T11:05:18.000000", 1.2, "FINAL(26)", [], final="26"),
    ]


def test_it_imports_an_rlms_trajectory_log(venues, subprocess_env, tmp_path):
    path = tmp_path / "rlm_2026-01-31_11-05-04_abc12345.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in rlms_log()))
    done = manage(subprocess_env, "frlm_import", str(path))
    assert done.returncode == 0, done.stderr
    run = Run.objects.get(id=done.stdout.strip())
    assert (run.status, run.answer) == ("succeeded", "26")
    assert run.question == "How many cities are in the list?"
    assert run.root_model["model"] == "gpt-5" and run.worker_model["model"] == "gpt-5-mini"
    assert (run.turns, run.subqueries, run.subqueries_failed) == (3, 7, 1)
    assert run.tokens_in == 500 + 400 + 300 + 300 + 800 + 30

    events = store.read_events(run.id)
    decodes = named(events, "Run.Decode", "end")
    assert sorted(e["depth"] for e in decodes) == [0, 0, 0, 1]
    cells = named(events, "Repl.Exec", "end")
    assert len(cells) == 6
    assert [c["status"] for c in cells].count("error") == 1
    assert len(named(events, "SubQuery.Submit", "start")) == 7
    assert len(named(events, "SubQuery.Execute", "end")) == 6
    (child,) = [e for e in named(events, "SubQuery.Submit", "start") if e["attrs"]["kind"] == "rlm"]
    assert blobs.blob_get(child["payload_ref"]) == "Check the total: 12 + 9 + 5"
    first_code = named(events, "Repl.Exec", "start")[0]
    assert blobs.blob_get(first_code["payload_ref"]) == "print(len(context))"
    (done_event,) = named(events, "Run.Done")
    assert blobs.blob_get(done_event["payload_ref"]) == "26"

    root = store.span_tree(run.id)[0]
    first_decode = root.children[0]
    assert first_decode.name == "Run.Decode"
    # Iteration 1 lasted 5 s, of which its code blocks took 2.01 s.
    assert abs((first_decode.end_ns - first_decode.start_ns) / 1e6 - 2990) < 1
    child_span = next(n for n in _walk(root) if n.attrs.get("kind") == "rlm")
    assert [c.name for c in child_span.children] == ["Run.Decode", "Repl.Exec"]
    assert all(c.start_ns >= child_span.start_ns for c in child_span.children)


def batched_log() -> tuple[list[dict], str, list[dict]]:
    """An rlms log without run_context (the question is in the root's user turn) whose one
    block ran llm_query_batched over 16 prompts in 160 ms: rlms logs each call at 10 ms."""
    question = "Which parts mention Lyon?"
    prompt = [
        {"role": "system", "content": "You are tasked with answering a query..."},
        {"role": "user", "content": "Your context is a str with 48000 total characters."},
        {
            "role": "user",
            "content": "You have not interacted with the REPL environment yet.\n\nThink "
            f'step-by-step ... to answer the original prompt: "{question}".\n\nYour next action:',
        },
    ]
    calls = [call("gpt-5-mini", f"Part {i}: Lyon?", "no", (100, 1), 0.01) for i in range(16)]
    first = iteration(
        1,
        "2026-01-31T11:05:10.000000",
        1.0,
        "```repl\nanswers = llm_query_batched(prompts)\n```",
        [block("answers = llm_query_batched(prompts)", 0.2, calls)],
    )
    first["prompt"] = prompt
    second = iteration(2, "2026-01-31T11:05:11.000000", 0.5, "FINAL(none)", [], final="none")
    second["prompt"] = [*prompt, {"role": "assistant", "content": first["response"]}]
    metadata = {**rlms_log()[0], "timestamp": "2026-01-31T11:05:08.000000"}
    return [metadata, first, second], question, prompt


def test_it_imports_an_rlms_batch_as_concurrent_calls_and_keeps_the_messages(
    venues, subprocess_env, tmp_path
):
    records, question, prompt = batched_log()
    path = tmp_path / "rlm_2026-01-31_11-05-08_batch.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    done = manage(subprocess_env, "frlm_import", str(path))
    assert done.returncode == 0, done.stderr
    run = Run.objects.get(id=done.stdout.strip())
    assert run.question == question
    events = store.read_events(run.id)
    starts = {e["span_id"]: e["ts"] for e in named(events, "SubQuery.Execute", "start")}
    ends = {e["span_id"]: e["ts"] for e in named(events, "SubQuery.Execute", "end")}
    assert len(starts) == 16 and len(set(starts.values())) == 1
    # Together they ran for the batch's 160 ms, as the log's 16 x 10 ms say; not end to end.
    assert {ends[k] - starts[k] for k in starts} == {160_000_000}
    submits = named(events, "SubQuery.Submit", "start")
    assert all(e["attrs"]["batched"] for e in submits)
    (cell,) = named(events, "Repl.Exec", "end")
    (cell_start,) = named(events, "Repl.Exec", "start")
    assert cell["ts"] - cell_start["ts"] == 200_000_000
    decodes = named(events, "Run.Decode", "start")
    assert json.loads(blobs.blob_get(decodes[0]["payload_ref"])) == prompt
    assert json.loads(blobs.blob_get(decodes[1]["payload_ref"]))[-1]["role"] == "assistant"


def _walk(node: SpanNode) -> list[SpanNode]:
    return [node, *(n for child in node.children for n in _walk(child))]


VALID_OTLP = json.dumps(
    {
        "resourceSpans": [
            {
                "resource": {"attributes": []},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "0" * 31 + "1",
                                "spanId": "0" * 15 + "1",
                                "name": "Run.Init",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001000000000",
                            }
                        ]
                    }
                ],
            }
        ]
    }
)
METADATA_LINE = json.dumps(rlms_log()[0])


BAD_INPUTS = [
    ("", "the file is empty; expected an OTLP/JSON trace"),
    ("hello, this is not a trace\n", "not JSON"),
    ('{"traces": []}', "expected an OTLP/JSON trace (a JSON object with resourceSpans)"),
    ('{"a": 1}\n{"b": 2}\n', "got JSON lines of neither kind"),
    (VALID_OTLP[:-30], "the file looks truncated"),
    (METADATA_LINE + "\n" + json.dumps(rlms_log()[2])[:-25], "the file looks truncated"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": []}]}]}', "the OTLP trace holds no spans"),
    (METADATA_LINE + "\n", "the rlms log has no iteration records"),
    (VALID_OTLP.replace("0" * 15 + "1", "xyz"), "spanId must be 16 hex digits"),
    (b"\x00\xff\xfe" * 40, "the file is not UTF-8 text"),
]


def write_input(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def test_it_rejects_what_it_cannot_import_and_leaves_nothing(venues, subprocess_env, tmp_path):
    runs, traces = Run.objects.count(), stored_runs()
    # Every case through the command in this process; a few as a user types them, all at
    # once (each process is a whole Django start-up).
    typed = []
    for number, (content, message) in enumerate(BAD_INPUTS):
        path = write_input(tmp_path / f"input-{number}", content)
        with pytest.raises(CommandError) as refused:
            call_command("frlm_import", str(path))
        assert message in str(refused.value) and "\n" not in str(refused.value)
        if number in (0, 2, 5, 6):
            command = [sys.executable, "manage.py", "frlm_import", str(path)]
            process = subprocess.Popen(command, env=subprocess_env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)  # fmt: skip
            typed.append((process, message))
    for process, message in typed:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 1, message
        assert message in stderr
        assert len(stderr.strip().splitlines()) == 1, stderr
    assert Run.objects.count() == runs
    assert stored_runs() == traces


def test_it_fails_the_run_when_no_recorder_stores_the_events(
    stack, venues, subprocess_env, tmp_path
):
    # A Redis database no recorder reads: the events are sent, and never stored.
    url = stack.redis_url.rsplit("/", 1)[0] + "/7"
    path = tmp_path / "rlm.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in rlms_log()))
    try:
        done = manage({**subprocess_env, "FRLM_REDIS_URL": url}, "frlm_import", str(path),
                      "--wait", "1", "--json")  # fmt: skip
    finally:
        redis.Redis.from_url(url).flushdb()
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["stored"] is False and result["status"] == "failed"
    run = Run.objects.get(id=result["run_id"])
    assert run.status == "failed"
    assert "is `python manage.py frlm_recorder` running" in run.error
    assert "no recorder heartbeat" in run.error
