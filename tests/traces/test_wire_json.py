"""The run page's first read of a trace, rendered as JSON text by the store's database
(traces.live.stored_wire_json), against the rows made in Python (stored_wire): the same
events once parsed, whatever the attributes hold; and the endpoint that serves it."""

from __future__ import annotations

import gzip
import json

import pytest
from django.test import Client

from tests.helpers import bare_run
from tests.pages.helpers import make_user
from traces import live, views
from traces.recorder import _write_segment

LONG = "x" * (live.ATTR_CHARS + 20)
ODD_ATTRS = [
    {},
    {"turn": 1},
    {"sq": 7, "venue": "edge"},
    {"_private": "secret", "shown": 1},  # a private key: dropped
    {"gone": None, "kept": "yes"},  # a null: dropped
    {"text": LONG},  # a long text: clipped
    {"nested": {"_k": 1, "n": None}},  # below the top level: kept as is
    {"quote": 'say "hi"\\n', "tab": "a\tb"},  # escapes
    {"name": "café ☕ 🚀"},  # not ASCII
    {"only": None},  # nothing left: null
    {"_payload": "the prompt"},  # the recorder takes the payload out
    {"list": [1, "two", None], "flag": True, "f": 0.1},
    {"tricky": 'null"_'},  # looks private or null, is neither
]


def _events(run_id: str) -> list[dict]:
    events = []
    for n, attrs in enumerate(ODD_ATTRS, start=1):
        events.append(
            {
                "run_id": run_id,
                "seq": n,
                "event_id": f"e{n}",
                "span_id": f"s{n:015d}",
                "parent_id": None if n == 1 else "s000000000000001",
                "name": "SubQuery.Execute" if n % 2 else "Repl.Exec",
                "phase": "start" if n % 3 else "end",
                "ts": 1_700_000_000_123_456_789 + n * 1_000_001,
                "status": "ok" if n % 4 else "error",
                "venue": "edge" if n % 2 else None,
                "worker_id": f"w{n}" if n % 2 else None,
                "depth": n % 3,
                "ms": 12.5 * n if n % 3 == 0 else None,
                "tokens_in": 800 + n if n % 3 == 0 else None,
                "tokens_out": 3 if n % 3 == 0 else None,
                "cost": 0.00075 * n if n % 3 == 0 else None,
                "links": [f"s{n - 1:015d}"] if n % 5 == 0 else [],
                "attrs": attrs,
            }
        )
    return events


def _store(run_id: str) -> None:
    events = _events(run_id)
    # Two segments, as a recorder writes a run in batches.
    _write_segment(run_id, events[:6], first_id="1-0")
    _write_segment(run_id, events[6:], first_id="2-0")


@pytest.fixture
def stored(settings, tmp_path):
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    _store("rwirejson0001")
    return "rwirejson0001"


def test_it_renders_the_same_rows_as_python(stored):
    for after in (0, 3, len(ODD_ATTRS) - 1):
        text = live.stored_wire_json(stored, after)
        rows = live.stored_wire(stored, after)
        assert json.loads(text["events"]) == rows
        assert text["count"] == len(rows)
        assert text["last_seq"] == rows[-1][0]
    rows = json.loads(live.stored_wire_json(stored)["events"])
    attrs = {row[0]: row[15] for row in rows}
    assert attrs[4] == {"shown": 1} and attrs[5] == {"kept": "yes"}
    assert attrs[6]["text"] == LONG[: live.ATTR_CHARS] + "…"
    assert attrs[1] is None and attrs[10] is None and attrs[11] is None
    assert "secret" not in json.dumps(rows) and "the prompt" not in json.dumps(rows)


def test_it_renders_nothing_after_the_last_seq_or_for_a_run_without_events(stored):
    assert live.stored_wire_json(stored, 10_000) == {"events": "[]", "count": 0, "last_seq": None}
    assert live.stored_wire_json("rnothinghere01")["events"] == "[]"


def test_it_serves_the_events_gzipped_to_a_browser_that_takes_gzip(
    settings, tmp_path, db, monkeypatch
):
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    monkeypatch.setattr(views, "EVENTS_GZIP_BYTES", 100)  # the test's answer is small
    owner = make_user("ops")
    run = bare_run(
        question="q",
        owner=owner,
    )
    _store(run.id)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(owner)
    url = f"/api/runs/{run.id}/events?after_seq=2"
    plain = client.get(url)
    packed = client.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert "Content-Encoding" not in plain and packed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in packed["Vary"]
    data = json.loads(gzip.decompress(packed.content))
    assert data == plain.json()
    assert data["fields"] == list(live.WIRE_FIELDS) and data["run_id"] == run.id
    assert data["events"] == live.stored_wire(run.id, 2) and data["last_seq"] == len(ODD_ATTRS)
    after = client.get(f"/api/runs/{run.id}/events?after_seq=99").json()
    assert after["events"] == [] and after["last_seq"] == 99
    stranger = Client(HTTP_HOST="127.0.0.1")
    stranger.force_login(make_user("stranger"))
    assert stranger.get(url).status_code == 404
