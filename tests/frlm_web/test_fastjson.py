"""The hot paths' JSON (frlm_web/fastjson.py): what it writes reads back as the standard
library wrote it, and what orjson refuses still goes through."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

from frlm_web import fastjson
from traces.emitter import append_args


def test_it_writes_what_the_standard_library_reads_back_the_same() -> None:
    value = {
        "name": "SubQuery.Submit",
        "ts": 1_795_878_752_931_532_757,
        "ms": 1e-05,
        "attrs": {"prompt": 'naïve ☃ "quoted"\n\u2028', "links": [], "nested": {"a": [1, 2.5]}},
    }
    assert json.loads(fastjson.dumps(value)) == value


def test_what_orjson_refuses_goes_through_the_standard_library() -> None:
    # An int past 64 bits (a hostile worker's figure in attrs) and keys that are not
    # strings were written before; they must not fail an event now.
    assert json.loads(fastjson.dumps({"huge": 10**30})) == {"huge": 10**30}
    assert json.loads(fastjson.dumps({1: "a", None: "b"})) == {"1": "a", "null": "b"}
    # Decimals and paths are written as their text, as default=str did.
    assert json.loads(fastjson.dumps({"cost": Decimal("0.10"), "p": Path("/x")})) == {
        "cost": "0.10",
        "p": "/x",
    }


def test_not_a_number_is_written_as_null_which_is_json() -> None:
    """The standard library wrote NaN, which is not JSON (DuckDB's parser and a page's
    JSON.parse refuse it)."""
    text = fastjson.dumps({"ms": math.nan, "cost": math.inf})
    assert json.loads(text) == {"ms": None, "cost": None}


def test_it_reads_what_json_loads_read() -> None:
    assert fastjson.loads('{"a": NaN}')["a"] != fastjson.loads('{"a": NaN}')["a"]  # a NaN
    assert fastjson.loads(b'[1, "\\u00e9"]') == [1, "é"]


def test_an_event_on_the_stream_is_the_json_of_the_event() -> None:
    event = {"run_id": "r1", "name": "Run.Init", "attrs": {"q": "¿qué?"}, "ts": 1}
    run_id, text = append_args([event])  # type: ignore[list-item]
    assert run_id == "r1" and json.loads(text) == event
