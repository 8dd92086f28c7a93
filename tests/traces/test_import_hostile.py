"""Hostile files given to `manage.py frlm_import` (OTLP/JSON and rlms logs).

The importer promises "every failure a ValueError ... JSON nested deeper than the parser
recurses included" (ARCHITECTURE.md §2, `frlm_web/jsontext.py`, at each boundary:
imports) and the command answers a file it cannot import with one line, "cannot import
FILE: why" (a CommandError), leaving nothing behind. Each file below is a few bytes a user
could be handed; each made the command die with a Python traceback (a review)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.models import Run

pytestmark = [pytest.mark.stack]


def _span(**fields: Any) -> dict[str, Any]:
    span = {
        "traceId": "b" * 32,
        "spanId": "a" * 16,
        "parentSpanId": "",
        "name": "root",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
        "attributes": [],
    }
    span.update(fields)
    return span


def _otlp(*spans: dict[str, Any]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]})


def _kv(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"key": key, "value": value}


def _frlm(name: str, *more: dict[str, Any]) -> list[dict[str, Any]]:
    return [_kv("frlm.event_name", {"stringValue": name}), *more]


META = {"type": "metadata", "timestamp": "2025-01-01T00:00:00", "root_model": "m"}


def _iteration(**fields: Any) -> dict[str, Any]:
    record = {
        "type": "iteration",
        "iteration": 1,
        "timestamp": "2025-01-01T00:00:10",
        "prompt": [{"role": "user", "content": "q"}],
        "response": "r",
        "code_blocks": [],
        "final_answer": "a",
        "iteration_time": 1.0,
    }
    record.update(fields)
    return record


def _call(**fields: Any) -> dict[str, Any]:
    call = {"root_model": "m", "prompt": "p", "response": "x", "execution_time": 0.5}
    call.update(fields)
    return call


def _block(*calls: dict[str, Any], **result: Any) -> dict[str, Any]:
    return {"code": "x = 1", "result": {"rlm_calls": list(calls), **result}}


def _rlms(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(record) + "\n" for record in (META, *records))


BAD_CHILD_METADATA = {"iterations": [_iteration()], "run_metadata": "s"}

HOSTILE = {
    # -- nesting: the JSON parser's RecursionError is not a ValueError ---------------------
    "otlp nested deeper than the parser recurses": "[" * 100_000 + "]" * 100_000,
    "a JSON line nested deeper than the parser recurses": (
        json.dumps(META) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n" + json.dumps(META)
    ),
    # -- OTLP fields of the wrong type ------------------------------------------------------
    "otlp arrayValue given as a list": _otlp(_span(attributes=[_kv("k", {"arrayValue": [1]})])),
    "otlp kvlistValue given as a list": _otlp(_span(attributes=[_kv("k", {"kvlistValue": [1]})])),
    "otlp span links given as a number": _otlp(_span(links=5)),
    "otlp span events given as a number": _otlp(_span(events=5)),
    "otlp frlm.end_attr_keys given as a number": _otlp(
        _span(attributes=_frlm("Run.Init", _kv("frlm.end_attr_keys", {"intValue": "5"})))
    ),
    "otlp collector lines whose resourceSpans is a number": (
        '{"resourceSpans": 5}\n{"resourceSpans": 5}\n'
    ),
    # -- numbers out of range ---------------------------------------------------------------
    "otlp start time Infinity (Python's json reads it)": _otlp(
        _span(startTimeUnixNano=float("inf"))
    ),
    "otlp span event time Infinity": _otlp(
        _span(events=[{"name": "Run.Done", "timeUnixNano": float("inf")}])
    ),
    "otlp model span with a negative cost": _otlp(
        _span(attributes=_frlm("SubQuery.Execute", _kv("frlm.cost", {"doubleValue": -1})))
    ),
    # -- rlms logs --------------------------------------------------------------------------
    "rlms iteration number that is not a number": _rlms(_iteration(iteration="abc")),
    "rlms iteration_time of 1e300 seconds": _rlms(_iteration(iteration_time=1e300)),
    "rlms block execution_time of 1e300 seconds": _rlms(
        _iteration(code_blocks=[_block(execution_time=1e300)])
    ),
    "rlms child trajectory whose iterations are strings": _rlms(
        _iteration(code_blocks=[_block(_call(metadata={"iterations": ["x"]}))])
    ),
    "rlms child trajectory whose run_metadata is a string": _rlms(
        _iteration(code_blocks=[_block(_call(metadata=BAD_CHILD_METADATA))])
    ),
    "rlms call with a negative total_cost": _rlms(
        _iteration(code_blocks=[_block(_call(usage_summary={"total_cost": -1}))])
    ),
    "rlms iteration prompt that is a number": _rlms({**_iteration(), "prompt": 5}),
    "rlms timestamp in year 1": _rlms(_iteration(timestamp="0001-01-01T00:00:00")),
}


@pytest.mark.parametrize("content", HOSTILE.values(), ids=list(HOSTILE))
def test_a_hostile_trace_file_is_refused_in_one_line(content: str, venues, tmp_path: Path) -> None:
    path = tmp_path / "hostile.json"
    path.write_text(content)
    runs = Run.objects.count()
    with pytest.raises(CommandError) as refused:
        call_command("frlm_import", str(path), "--wait", "2")
    assert str(refused.value).startswith(f"cannot import {path}")
    assert "\n" not in str(refused.value)
    assert Run.objects.count() == runs
