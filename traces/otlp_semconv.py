"""What LLM trace viewers read from an exported span (ARCHITECTURE.md §9), written beside
FRLM's own `frlm.*` attributes by `traces/otlp.py`:

- OpenInference (Arize Phoenix): `openinference.span.kind` on every span (AGENT for a run
  or a child RLM, LLM for model calls, TOOL for REPL cells, RETRIEVER for fragment
  selection, EVALUATOR for verification, CHAIN for the rest), `input.value` /
  `output.value` with their mime types, `llm.input_messages.N.message.role|content`,
  `llm.output_messages.N.message.*`, `llm.model_name`, `llm.system`, `llm.provider`,
  `llm.token_count.prompt|completion|total`, `llm.cost.total`, `tool.name`, and
  `session.id` (the run id) on the root, which lists the run under Phoenix's Sessions.
  Phoenix (checked with 20.26) prices a span itself, tokens times the prices of the model
  its Settings > Models table matches to `llm.model_name`, and ignores `llm.cost.total`:
  FRLM's simulated models, or a model at FRLM_PRICES rates, show FRLM's cost there only
  once those prices are entered in that table;
- OpenTelemetry GenAI semantic conventions: `gen_ai.input.messages` /
  `gen_ai.output.messages` (JSON, messages of typed parts), `gen_ai.usage.input_tokens` /
  `output_tokens`, and `gen_ai.usage.cost`, which Langfuse reads as the total cost;
- Langfuse's own keys, which it ranks above the others: `langfuse.observation.type`
  (generation, agent, tool, chain, retriever, evaluator, span),
  `langfuse.observation.input|output`, `langfuse.observation.level` and
  `status_message`, `langfuse.observation.usage_details` / `cost_details` (JSON), and on
  the root `langfuse.trace.name|input|output` and `session.id`.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from frlm_web import jsontext

MODEL_SPANS = frozenset({"Run.Decode", "SubQuery.Execute"})

# OpenInference span kind, and the Langfuse observation type that says the same.
_KINDS: dict[str, tuple[str, str]] = {
    "Run.Init": ("AGENT", "agent"),
    "Run.Decode": ("LLM", "generation"),
    "SubQuery.Execute": ("LLM", "generation"),
    "Repl.Exec": ("TOOL", "tool"),
    "Env.SelectFragments": ("RETRIEVER", "retriever"),
    "Env.LoadFragment": ("RETRIEVER", "retriever"),
    "Verify.Redundant": ("EVALUATOR", "evaluator"),
    "Verify.Objective": ("EVALUATOR", "evaluator"),
    "Verify.Attest": ("EVALUATOR", "evaluator"),
}
_CHAIN = ("CHAIN", "chain")
_LEVELS = {"ok": "DEFAULT", "cancelled": "WARNING", "rejected": "WARNING"}


class Message(TypedDict):
    role: str
    content: str


class SpanText(TypedDict, total=False):
    """What went into a span and what came out, as texts (None when unknown)."""

    input: str | None
    output: str | None
    messages: list[Message] | None  # a model span's input as chat messages


def span_kind(name: str, attrs: dict[str, Any]) -> tuple[str, str]:
    """(OpenInference span kind, Langfuse observation type) of an FRLM span."""
    if name == "SubQuery.Submit" and attrs.get("kind") == "rlm":
        return "AGENT", "agent"  # rlm_query: a child RLM with turns of its own
    return _KINDS.get(name, _CHAIN)


def chat_messages(text: str | None) -> list[Message] | None:
    """A Run.Decode input (a JSON list of {role, content}) as messages; None otherwise."""
    if not text:
        return None
    try:
        value = jsontext.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not value:
        return None
    messages: list[Message] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            return None
        messages.append({"role": str(item.get("role") or "user"), "content": item["content"]})
    return messages


def semconv_fields(
    name: str,
    attrs: dict[str, Any],
    text: SpanText,
    *,
    model: str | None,
    provider: str | None,
    tokens: tuple[Any, Any],
    cost: Any,
    status: str,
    status_message: str | None,
) -> dict[str, Any]:
    """The OpenInference, GenAI and Langfuse attributes of one span."""
    kind, observation = span_kind(name, attrs)
    fields: dict[str, Any] = {
        "openinference.span.kind": kind,
        "langfuse.observation.type": observation,
        "langfuse.observation.level": _LEVELS.get(status, "ERROR"),
    }
    if status != "ok" and status_message:
        fields["langfuse.observation.status_message"] = status_message
    fields.update(_io_fields(text))
    if kind == "TOOL":
        fields["tool.name"] = "python"
        fields["tool.description"] = "a cell of the run's sandboxed Python REPL"
    if name in MODEL_SPANS:
        fields.update(_model_fields(text, model, provider))
        fields.update(_usage_fields(tokens, cost))
    return fields


def _io_fields(text: SpanText) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    messages = text.get("messages")
    if messages:
        fields["input.value"] = json.dumps({"messages": messages}, ensure_ascii=False)
        fields["input.mime_type"] = "application/json"
    elif text.get("input") is not None:
        fields["input.value"] = text["input"]
        fields["input.mime_type"] = "text/plain"
    if text.get("output") is not None:
        fields["output.value"] = text["output"]
        fields["output.mime_type"] = "text/plain"
    if "input.value" in fields:
        fields["langfuse.observation.input"] = fields["input.value"]
    if "output.value" in fields:
        fields["langfuse.observation.output"] = fields["output.value"]
    return fields


def _model_fields(text: SpanText, model: str | None, provider: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    if model:
        fields["gen_ai.request.model"] = model
        fields["gen_ai.response.model"] = model
        fields["llm.model_name"] = model
    if provider:
        fields["gen_ai.provider.name"] = provider
        fields["gen_ai.system"] = provider  # the name older viewers know
        fields["llm.system"] = provider
        fields["llm.provider"] = provider
    messages = text.get("messages")
    if messages is None and text.get("input") is not None:
        messages = [{"role": "user", "content": text["input"] or ""}]
    for i, message in enumerate(messages or []):
        fields[f"llm.input_messages.{i}.message.role"] = message["role"]
        fields[f"llm.input_messages.{i}.message.content"] = message["content"]
    if messages:
        fields["gen_ai.input.messages"] = json.dumps(
            [_genai_message(m["role"], m["content"]) for m in messages], ensure_ascii=False
        )
    reply = text.get("output")
    if reply is not None:
        fields["llm.output_messages.0.message.role"] = "assistant"
        fields["llm.output_messages.0.message.content"] = reply
        fields["gen_ai.output.messages"] = json.dumps(
            [{**_genai_message("assistant", reply), "finish_reason": "stop"}], ensure_ascii=False
        )
    return fields


def _genai_message(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def _usage_fields(tokens: tuple[Any, Any], cost: Any) -> dict[str, Any]:
    tokens_in, tokens_out = (_count(t) for t in tokens)
    fields: dict[str, Any] = {
        "gen_ai.usage.input_tokens": tokens_in,
        "gen_ai.usage.output_tokens": tokens_out,
        "llm.token_count.prompt": tokens_in,
        "llm.token_count.completion": tokens_out,
    }
    usage: dict[str, int] = {}
    if tokens_in is not None:
        usage["input"] = tokens_in
    if tokens_out is not None:
        usage["output"] = tokens_out
    if usage:
        usage["total"] = sum(usage.values())
        fields["llm.token_count.total"] = usage["total"]
        fields["langfuse.observation.usage_details"] = json.dumps(usage)
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        fields["llm.cost.total"] = float(cost)
        fields["gen_ai.usage.cost"] = float(cost)
        fields["langfuse.observation.cost_details"] = json.dumps({"total": float(cost)})
    return fields


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def trace_fields(run_id: str, question: str | None, answer: str | None) -> dict[str, Any]:
    """What the root span tells the viewers about the whole trace: its name, question and
    answer for Langfuse, and `session.id`, by which Phoenix and Langfuse list the run
    under Sessions with that question and answer."""
    fields: dict[str, Any] = {"langfuse.trace.name": f"frlm run {run_id}", "session.id": run_id}
    if question is not None:
        fields["langfuse.trace.input"] = question
    if answer is not None:
        fields["langfuse.trace.output"] = answer
    return fields
