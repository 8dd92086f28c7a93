"""Import of a trajectory log of the official RLM library (`rlms`,
github.com/alexzhang13/rlm), read from its `rlm/logger/rlm_logger.py` (RLMLogger) and
`rlm/core/types.py` (the `to_dict` of RLMMetadata, RLMIteration, CodeBlock, REPLResult,
RLMChatCompletion, UsageSummary), and the visualizer's reader
`visualizer/src/lib/parse-logs.ts`.

The log is JSON lines, written as the run goes:
- `{"type": "metadata", "timestamp", "root_model", "max_depth", "max_iterations",
  "backend", "backend_kwargs", "environment_type", "environment_kwargs",
  "other_backends"}`: first, once;
- `{"type": "run_context", "timestamp", "prompt", "root_prompt", ...}`: in some versions;
- `{"type": "iteration", "iteration": n, "timestamp", "prompt": [messages], "response",
  "code_blocks": [{"code", "result": {"stdout", "stderr", "locals", "execution_time",
  "rlm_calls": [call...]}}], "final_answer": text | [name, value] | null,
  "iteration_time"}`: one per root-model turn; `timestamp` is when it was logged (its
  end), a naive ISO time in the writer's local zone (read here in the local zone);
  times are seconds;
- a call: `{"root_model", "prompt": text | object | messages, "response",
  "usage_summary": {"model_usage_summaries": {model: {"total_calls",
  "total_input_tokens", "total_output_tokens", "total_cost"?}}, "total_cost"?},
  "execution_time", "error"?, "metadata"?}`; a child RLM (`rlm_query`) carries its own
  trajectory in `metadata` = `{"run_metadata": {...}, "iterations": [iteration...]}`.
  Older logs put `prompt_tokens` / `completion_tokens` on the call.

What becomes what:
- the run: Run.Init (root span; attrs question = run_context.root_prompt when logged,
  else the root prompt the first iteration's user turn quotes, else its first user message;
  root_model, worker_model, policy = max_depth / max_iterations, the rlms settings) and
  Run.Done at its end (answer = the last final_answer; error when there is none);
- each iteration: Run.Decode (turn = iteration, model, start payload = the iteration's
  input messages as a JSON list of {role, content}, end payload = response), then one
  Repl.Exec per code block (start payload = code, end payload = stdout + stderr; status
  error when stderr is not empty; attrs variables = the names in locals);
- each call in a block's rlm_calls: SubQuery.Submit (start payload = prompt, end payload
  = response) holding SubQuery.Execute (worker = the call's model, venue = the backend,
  tokens and cost from usage_summary, end payload = response) and a SubQuery.Return
  instant; a child RLM is a SubQuery.Submit of kind rlm holding the child's iterations one
  level deeper, as FRLM records rlm_query;
- a response starting "Error:" (how rlms reports a failed call) or an `error` field makes
  the sub-query's status error.

Timings: an iteration ends at its timestamp and lasts iteration_time; its decode takes
what the code blocks leave of it; blocks follow one another, each lasting its
execution_time. rlms logs each call of an llm_query_batched with the batch's time divided
by the number of calls, so consecutive plain calls of one block with an identical time are
a batch: they start together and each lasts the batch's time (their logged times summed),
marked `batched`. Other calls and batches follow one another, or all start with the block
when their times add up to more than the block's. A
child's iterations are laid out from the start of its sub-query. Without timestamps,
steps follow one another from the metadata time. The root model's tokens per turn are not
in the log, so Run.Decode spans carry none; sub-call tokens and cost are kept.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from traces.interchange import ImportedEvent, ImportedSpan, InterchangeError, ParsedTrace

_KINDS = ("metadata", "iteration", "run_context")
_NS = 1_000_000_000
# How rlms's user turn names the root prompt (rlm/utils/prompts.py, USER_PROMPT_WITH_ROOT).
_ORIGINAL_PROMPT = re.compile(r'answer the original prompt: "(.*)"\.', re.DOTALL)


@dataclass
class _Totals:
    subqueries: int = 0
    failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


@dataclass
class _Builder:
    venue: str
    spans: list[ImportedSpan] = field(default_factory=list)
    totals: _Totals = field(default_factory=_Totals)
    worker_model: str | None = None

    def add(self, span: ImportedSpan) -> ImportedSpan:
        self.spans.append(span)
        return span

    def key(self) -> str:
        return f"s{len(self.spans) + 1}"


def is_rlms_record(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    if record.get("type") in _KINDS:
        return True
    # The visualizer reads an untyped line as an iteration; so does this reader.
    return "type" not in record and "code_blocks" in record and "response" in record


def from_rlms_log(records: list[tuple[int, Any]]) -> ParsedTrace:
    """The parsed lines (number, object) of an rlms log as spans; InterchangeError names
    the first line that does not fit."""
    metadata: dict[str, Any] = {}
    context: dict[str, Any] = {}
    iterations: list[dict[str, Any]] = []
    for number, record in records:
        if not is_rlms_record(record):
            raise InterchangeError(
                f"line {number} is not an rlms log record: expected an object with type "
                f"metadata or iteration, got {_brief(record)}"
            )
        kind = record.get("type", "iteration")
        if kind == "metadata":
            metadata = metadata or record
        elif kind == "run_context":
            context = context or record
        else:
            _check_iteration(record, f"line {number}")
            iterations.append(record)
    if not iterations:
        raise InterchangeError("the rlms log has no iteration records: there is no run in it")
    return _build(metadata, context, iterations)


def _check_iteration(record: dict[str, Any], where: str) -> None:
    if not isinstance(record.get("response"), str):
        raise InterchangeError(f"{where}: an rlms iteration needs its response as text")
    blocks = record.get("code_blocks")
    if not isinstance(blocks, list):
        raise InterchangeError(f"{where}: an rlms iteration needs code_blocks as a list")
    for n, block in enumerate(blocks, start=1):
        if not isinstance(block, dict) or not isinstance(block.get("code"), str):
            raise InterchangeError(f"{where}: code block {n} needs its code as text")
        result = block.get("result") or {}
        if not isinstance(result, dict):
            raise InterchangeError(f"{where}: code block {n} has a result that is not an object")
        for call in _calls(result):
            if not isinstance(call, dict):
                raise InterchangeError(
                    f"{where}: code block {n} has a sub-call that is not an object"
                )
            child = (
                (call.get("metadata") or {}).get("iterations")
                if isinstance(call.get("metadata"), dict)
                else None
            )
            for child_iteration in child or []:
                _check_iteration(child_iteration, f"{where} (a child RLM)")


def _build(
    metadata: dict[str, Any], context: dict[str, Any], iterations: list[dict[str, Any]]
) -> ParsedTrace:
    builder = _Builder(venue=str(metadata.get("backend") or "rlms"))
    origin = _iso_ns(metadata.get("timestamp")) or _iso_ns(iterations[0].get("timestamp"))
    first = _natural_start(iterations)
    start_ns = first if first is not None else origin or time.time_ns()
    root = builder.add(
        ImportedSpan(key="s1", parent=None, name="Run.Init", start_ns=start_ns, end_ns=None)
    )
    root_model = _text(metadata.get("root_model")) or "unknown"
    end_ns = _iterations(
        builder, iterations, parent="s1", depth=0, start_ns=start_ns, shift_ns=0, model=root_model
    )
    answer = _final_answer(iterations)
    question = _text(context.get("root_prompt")) or _question(iterations[0].get("prompt")) or ""
    t = builder.totals
    root.end_ns = end_ns
    root.start_attrs = {
        "question": question,
        "root_model": root_model,
        "worker_model": builder.worker_model or root_model,
        "policy": {k: metadata[k] for k in ("max_depth", "max_iterations") if k in metadata},
        "context_source": "imported",
        "rlms": {
            k: metadata.get(k)
            for k in ("backend", "environment_type", "other_backends")
            if metadata.get(k) is not None
        },
    }
    root.metrics = {
        "ms": (end_ns - start_ns) / 1e6,
        "tokens_in": t.tokens_in,
        "tokens_out": t.tokens_out,
        "cost": t.cost,
    }
    error = None if answer is not None else "the rlms log ends without a final answer"
    root.status = "ok" if answer is not None else "error"
    if error:
        root.end_attrs["error"] = error
    root.events.append(
        ImportedEvent(
            name="Run.Done",
            ts_ns=end_ns,
            status=root.status,
            payload=answer if answer is not None else error,
            attrs={
                "answer": (answer or "")[:500],
                "error": error,
                "wall_ms": (end_ns - start_ns) / 1e6,
                "turns": len(iterations),
                "subqueries": t.subqueries,
                "subqueries_failed": t.failed,
                "tokens_in": t.tokens_in,
                "tokens_out": t.tokens_out,
                "cost": t.cost,
            },
        )
    )
    notes = {"iterations": len(iterations), "root_model": root_model}
    return ParsedTrace("rlms", builder.spans, notes=notes)


def _iterations(
    builder: _Builder,
    iterations: list[dict[str, Any]],
    *,
    parent: str,
    depth: int,
    start_ns: int,
    shift_ns: int | None,
    model: str,
) -> int:
    """Lay the iterations out from start_ns; returns when the last one ends."""
    cursor = start_ns
    for number, iteration in enumerate(iterations, start=1):
        blocks = iteration.get("code_blocks") or []
        block_ns = sum(_secs_ns(_result(b).get("execution_time")) for b in blocks)
        total_ns = _secs_ns(iteration.get("iteration_time"))
        logged = _iso_ns(iteration.get("timestamp")) if shift_ns is not None else None
        begin = cursor
        if logged is not None:
            begin = max(cursor, logged + shift_ns - (total_ns or block_ns))
        decode_ns = max(0, total_ns - block_ns)
        turn = int(iteration.get("iteration") or number)
        builder.add(
            ImportedSpan(
                key=builder.key(),
                parent=parent,
                name="Run.Decode",
                start_ns=begin,
                end_ns=begin + decode_ns,
                depth=depth,
                metrics={"ms": decode_ns / 1e6},
                start_attrs={"turn": turn, "model": model},
                start_payload=_messages_text(iteration.get("prompt")),
                end_payload=iteration["response"],
            )
        )
        at = begin + decode_ns
        for cell, block in enumerate(blocks, start=1):
            at = _code_block(
                builder, block, parent=parent, depth=depth, start_ns=at, turn=turn, cell=cell
            )
        cursor = max(at, begin + total_ns)
    return cursor


def _code_block(
    builder: _Builder,
    block: dict[str, Any],
    *,
    parent: str,
    depth: int,
    start_ns: int,
    turn: int,
    cell: int,
) -> int:
    result = _result(block)
    stderr = _text(result.get("stderr")) or ""
    output = (_text(result.get("stdout")) or "") + (
        ("\n" if result.get("stdout") else "") + stderr if stderr else ""
    )
    span = builder.add(
        ImportedSpan(
            key=builder.key(),
            parent=parent,
            name="Repl.Exec",
            start_ns=start_ns,
            end_ns=None,
            depth=depth,
            status="error" if stderr.strip() else "ok",
            start_attrs={"turn": turn, "cell": cell},
            start_payload=block["code"],
            end_payload=output,
        )
    )
    if stderr.strip():
        span.end_attrs["error"] = stderr.strip().splitlines()[-1]
    if isinstance(result.get("locals"), dict):
        span.end_attrs["variables"] = sorted(str(k) for k in result["locals"])
    if result.get("final_answer") is not None:
        span.end_attrs["final"] = True
    own_ns = _secs_ns(result.get("execution_time"))
    calls = [c for c in _calls(result) if isinstance(c, dict)]
    groups = _batches(calls)
    together = len(groups) > 1 and sum(_group_ns(g) for g in groups) > own_ns
    end_ns = start_ns + own_ns
    at, index = start_ns, 0
    for group in groups:
        group_end = at
        for call in group:
            call_end = _call(
                builder,
                call,
                parent=span.key,
                depth=depth,
                start_ns=at,
                index=index,
                batch_ns=_group_ns(group) if len(group) > 1 else None,
            )
            group_end, index = max(group_end, call_end), index + 1
        end_ns = max(end_ns, group_end)
        at = start_ns if together else group_end
    span.end_ns = end_ns
    span.metrics = {"ms": (end_ns - start_ns) / 1e6}
    return end_ns


def _batches(calls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The block's calls in groups that ran together: rlms logs each call of one
    llm_query_batched with the batch's time divided by their number, so consecutive plain
    calls with one identical time are a batch; any other call is a group of its own."""
    groups: list[list[dict[str, Any]]] = []
    for call in calls:
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and not _is_child(call)
            and not _is_child(last)
            and _secs_ns(call.get("execution_time")) > 0
            and call.get("execution_time") == last.get("execution_time")
        ):
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups


def _group_ns(group: list[dict[str, Any]]) -> int:
    """How long a group ran: a batch the sum of its calls' logged shares, a lone call its
    own time."""
    return sum(_secs_ns(c.get("execution_time")) for c in group)


def _is_child(call: dict[str, Any]) -> bool:
    trajectory = call.get("metadata")
    return isinstance(trajectory, dict) and bool(trajectory.get("iterations"))


def _call(
    builder: _Builder,
    call: dict[str, Any],
    *,
    parent: str,
    depth: int,
    start_ns: int,
    index: int,
    batch_ns: int | None = None,
) -> int:
    """One llm_query (Submit > Execute) or rlm_query (Submit > the child's iterations); a
    call of a batch (batch_ns) lasts the whole batch's time, as it was out that long."""
    model = _text(call.get("root_model")) or _first_model(call) or "unknown"
    response = call.get("response")
    reply = response if isinstance(response, str) else json.dumps(response)
    failed = bool(call.get("error")) or reply.startswith("Error:")
    tokens_in, tokens_out, cost = _usage(call)
    trajectory = call.get("metadata") if isinstance(call.get("metadata"), dict) else {}
    child = trajectory.get("iterations") or []
    end_ns = start_ns + (batch_ns or _secs_ns(call.get("execution_time")))
    status = "error" if failed else "ok"
    submit = builder.add(
        ImportedSpan(
            key=builder.key(),
            parent=parent,
            name="SubQuery.Submit",
            start_ns=start_ns,
            end_ns=None,
            depth=depth + 1 if child else depth,
            venue=builder.venue,
            status=status,
            start_attrs={
                "sq": index,
                "kind": "rlm" if child else "llm",
                **({"batched": True} if batch_ns else {}),
            },
            start_payload=_prompt_text(call.get("prompt")),
            end_payload=reply,
        )
    )
    builder.totals.subqueries += 1
    builder.totals.failed += int(failed)
    if depth == 0:  # a child's usage already counts its own calls
        builder.totals.tokens_in += tokens_in
        builder.totals.tokens_out += tokens_out
        builder.totals.cost += cost
    if failed:
        submit.end_attrs["error"] = str(call.get("error") or reply)
    if child:
        child_model = _text((trajectory.get("run_metadata") or {}).get("root_model")) or model
        natural = _natural_start(child)
        shift = start_ns - natural if natural is not None else None
        end_ns = max(
            end_ns,
            _iterations(
                builder,
                child,
                parent=submit.key,
                depth=depth + 1,
                start_ns=start_ns,
                shift_ns=shift,
                model=child_model,
            ),
        )
    else:
        builder.worker_model = builder.worker_model or model
        builder.add(
            ImportedSpan(
                key=builder.key(),
                parent=submit.key,
                name="SubQuery.Execute",
                start_ns=start_ns,
                end_ns=end_ns,
                depth=depth,
                venue=builder.venue,
                worker_id=model,
                status=status,
                metrics={
                    "ms": (end_ns - start_ns) / 1e6,
                    "tokens_in": tokens_in,
                    "tokens_out": tokens_out,
                    "cost": cost,
                },
                start_attrs={"model": model},
                end_attrs={"error": submit.end_attrs["error"]} if failed else {},
                end_payload=reply,
            )
        )
    submit.end_ns = end_ns
    submit.metrics = {
        "ms": (end_ns - start_ns) / 1e6,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost": cost,
    }
    submit.events.append(
        ImportedEvent(
            name="SubQuery.Return",
            ts_ns=end_ns,
            status=status,
            venue=builder.venue,
            worker_id=None if child else model,
            depth=submit.depth,
            attrs={"sq": index},
        )
    )
    return end_ns


# --- fields -------------------------------------------------------------------------------


def _result(block: dict[str, Any]) -> dict[str, Any]:
    result = block.get("result")
    return result if isinstance(result, dict) else {}


def _calls(result: dict[str, Any]) -> list[Any]:
    calls = result.get("rlm_calls", result.get("llm_calls"))
    return calls if isinstance(calls, list) else []


def _usage(call: dict[str, Any]) -> tuple[int, int, float]:
    summary = call.get("usage_summary") if isinstance(call.get("usage_summary"), dict) else {}
    per_model = summary.get("model_usage_summaries") or {}
    tokens_in = tokens_out = 0
    cost = 0.0
    for usage in per_model.values() if isinstance(per_model, dict) else []:
        if isinstance(usage, dict):
            tokens_in += _int(usage.get("total_input_tokens"))
            tokens_out += _int(usage.get("total_output_tokens"))
            cost += _float(usage.get("total_cost"))
    if not per_model:  # older logs
        tokens_in, tokens_out = _int(call.get("prompt_tokens")), _int(call.get("completion_tokens"))
    if summary.get("total_cost") is not None:
        cost = _float(summary["total_cost"])
    return tokens_in, tokens_out, cost


def _first_model(call: dict[str, Any]) -> str | None:
    summary = call.get("usage_summary") if isinstance(call.get("usage_summary"), dict) else {}
    per_model = summary.get("model_usage_summaries")
    return next(iter(per_model), None) if isinstance(per_model, dict) and per_model else None


def _messages_text(prompt: Any) -> str | None:
    """An iteration's input as FRLM records a root turn's: a JSON list of {role, content}."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        return None
    messages = [
        {"role": str(m.get("role") or "user"), "content": _prompt_text(m.get("content"))}
        for m in prompt
        if isinstance(m, dict)
    ]
    return json.dumps(messages, ensure_ascii=False) if messages else None


def _question(prompt: Any) -> str | None:
    """The question of a log without run_context: the root prompt rlms quotes in its user
    turn ('... answer the original prompt: "QUESTION".'), else the first user message."""
    if isinstance(prompt, str):
        return _text(prompt)
    users = [
        m["content"]
        for m in prompt or []
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    ]
    for content in users:
        quoted = _ORIGINAL_PROMPT.search(content)
        if quoted:
            return quoted.group(1)
    return _text(users[0]) if users else None


def _final_answer(iterations: list[dict[str, Any]]) -> str | None:
    for iteration in reversed(iterations):
        answer = iteration.get("final_answer")
        if answer is None:
            continue
        # FINAL_VAR is logged as [variable name, value] in some versions.
        if isinstance(answer, list | tuple) and len(answer) == 2:
            answer = answer[1]
        return answer if isinstance(answer, str) else json.dumps(answer)
    return None


def _natural_start(iterations: list[dict[str, Any]]) -> int | None:
    first = iterations[0] if iterations else {}
    logged = _iso_ns(first.get("timestamp"))
    if logged is None:
        return None
    blocks = first.get("code_blocks") or []
    block_ns = sum(_secs_ns(_result(b).get("execution_time")) for b in blocks)
    return logged - (_secs_ns(first.get("iteration_time")) or block_ns)


def _iso_ns(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # rlms logs local wall-clock time
    return int(moment.timestamp()) * _NS + moment.microsecond * 1000


def _secs_ns(value: Any) -> int:
    seconds = _float(value)
    return int(seconds * _NS) if seconds > 0 else 0


def _prompt_text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _float(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return 0.0


def _brief(record: Any) -> str:
    if isinstance(record, dict):
        return f"an object with keys {sorted(record)[:6]}"
    return type(record).__name__
