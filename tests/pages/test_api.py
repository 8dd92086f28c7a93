"""The JSON endpoints behind the pages: events after a seq, a span's detail with its
payload texts, the turns, aggregates and the diff; and the launcher's staff-only path."""

from __future__ import annotations

from django.test import Client

from runs.models import Run
from runs.services import run_launch, run_replay
from tests.helpers import finish, launch, scripted, stack_worker_ids, trace
from tests.pages.helpers import launcher_form, make_user
from traces.live import WIRE_FIELDS
from workers.models import Venue, Worker


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_it_serves_events_after_a_seq_and_a_spans_texts(venues):
    client = signed_in(make_user("ops", staff=True))
    run = finish(launch(question=scripted("print('hello ' * 3)", "FINAL('bye')")))
    stored = trace(run)
    data = client.get(f"/api/runs/{run.id}/events?after_seq=5").json()
    assert data["fields"] == list(WIRE_FIELDS)
    assert [e[0] for e in data["events"]] == [e["seq"] for e in stored if e["seq"] > 5]
    assert data["last_seq"] == stored[-1]["seq"]
    assert "_payload" not in str(data)
    cell = next(e for e in stored if e["name"] == "Repl.Exec" and e["phase"] == "start")
    detail = client.get(f"/api/runs/{run.id}/spans/{cell['span_id']}").json()
    assert detail["name"] == "Repl.Exec" and detail["labels"] == ["code", "output"]
    assert detail["input"]["text"] == "print('hello ' * 3)"
    assert detail["output"]["text"].strip() == "hello hello hello"
    assert detail["status"] == "ok" and detail["ms"] > 0
    assert client.get(f"/api/runs/{run.id}/spans/nosuchspan").status_code == 404
    turns = client.get(f"/api/runs/{run.id}/turns").json()["turns"]
    assert [t["turn"] for t in turns] == [1, 2]
    assert turns[0]["cells"][0]["code"]["text"] == "print('hello ' * 3)"
    assert "```repl" in turns[0]["decode"]["reply"]["text"]


def test_it_serves_aggregates_and_the_diff_of_a_replay(venues):
    client = signed_in(make_user("ops", staff=True))
    run = finish(launch(task="sniah", tokens=60_000, seed=2))
    trace(run)
    aggregates = client.get(f"/api/runs/{run.id}/aggregates?bin_ms=100&by=worker").json()
    assert aggregates["summary"]["subqueries"]["ok"] == run.subqueries
    assert {w["worker_id"] for w in aggregates["workers"]} <= stack_worker_ids()
    assert aggregates["bins"] and aggregates["bin_ms"] == 100
    assert client.get(f"/api/runs/{run.id}/aggregates?by=colour").status_code == 400
    copy = run_replay(run)
    run_launch(copy)
    finish(copy)
    trace(copy)
    diff = client.get(f"/api/diff?a={run.id}&b={copy.id}").json()
    assert diff["run_a"] == run.id and diff["run_b"] == copy.id
    assert diff["summary"]["only_in_a"] == 0 and diff["summary"]["only_in_b"] == 0
    assert diff["answer"]["a"] == diff["answer"]["b"]
    assert client.get(f"/api/diff?a={run.id}&b=rnothere").status_code == 404
    missing = client.get(f"/api/diff?a={run.id}")
    assert missing.status_code == 400 and "?a=RUN_ID&b=RUN_ID" in missing.json()["error"]


def test_it_keeps_server_paths_to_staff(venues, context_root):
    notes = context_root / "notes.txt"
    notes.write_text("a line of text\n")
    form = launcher_form(
        question="What is in it?",
        context_source="path",
        context_path=str(notes),
        task_tokens="1000",
    )
    guest = signed_in(make_user("guest"))
    # Not offered to whom it would refuse; named anyway, refused with the reason.
    assert 'value="path"' not in guest.get("/runs/new").content.decode()
    response = guest.post("/runs/new", form)
    assert response.status_code == 400
    assert "only staff may read files on the server" in response.content.decode()
    staff = signed_in(make_user("ops", staff=True))
    assert 'value="path"' in staff.get("/runs/new").content.decode()
    response = staff.post("/runs/new", form)
    assert response.status_code == 302 and response["Location"].startswith("/runs/r")
    run = finish(Run.objects.get(id=response["Location"].rsplit("/", 1)[1]))
    assert run.status == "succeeded" and run.context_source == "path", run.error


def test_it_gathers_a_subquerys_prompt_reply_routing_and_attempts_from_either_span(venues):
    client = signed_in(make_user("ops", staff=True))
    run = finish(launch(task="sniah", tokens=60_000, seed=3))
    stored = trace(run)
    submit = next(e for e in stored if e["name"] == "SubQuery.Submit" and e["phase"] == "start")
    execute = next(
        e
        for e in stored
        if e["name"] == "SubQuery.Execute"
        and e["parent_id"] == submit["span_id"]
        and e["phase"] == "end"
    )
    by_submit = client.get(f"/api/runs/{run.id}/spans/{submit['span_id']}").json()["subquery"]
    by_execute = client.get(f"/api/runs/{run.id}/spans/{execute['span_id']}").json()["subquery"]
    assert by_submit == by_execute  # the same sub-query, whichever span was clicked
    assert by_submit["submit_span"] == submit["span_id"]
    assert "special magic number" in by_submit["prompt"]["text"]
    assert by_submit["reply"]["text"]
    assert by_submit["routing"]["route"] == submit["attrs"]["route"]
    assert by_submit["routing"]["decision"] == submit["attrs"].get("routing")
    attempt = next(a for a in by_submit["attempts"] if a["span_id"] == execute["span_id"])
    assert attempt["worker_id"] == execute["worker_id"] and attempt["status"] == "ok"
    # Spans that are no sub-query's have none; another user's run is not found.
    root = next(e for e in stored if e["name"] == "Run.Init")
    assert client.get(f"/api/runs/{run.id}/spans/{root['span_id']}").json()["subquery"] is None
    other = signed_in(make_user("mallory"))
    assert other.get(f"/api/runs/{run.id}/spans/{submit['span_id']}").status_code == 404


def test_it_names_workers_by_id_saying_which_have_departed(venues):
    client = signed_in(make_user("ops"))
    venue = Venue.objects.get(name="edge")
    staying, gone = (
        Worker.objects.create(name=name, venue=venue, public_key="k" * 44)
        for name in ("edge-names-1", "edge-names-2")
    )
    Worker.objects.filter(id=gone.id).update(status=Worker.Status.DEREGISTERED)
    ids = [staying.id, gone.id]
    names = client.get("/api/worker-names", {"id": [*ids, "wnosuchworker"]}).json()["workers"]
    assert set(names) == set(ids)
    assert names[staying.id] == {"name": "edge-names-1", "venue": "edge", "departed": False}
    assert names[gone.id]["departed"] is True
    too_many = client.get("/api/worker-names", {"id": [f"w{i}" for i in range(201)]})
    assert too_many.status_code == 400 and "at most 200" in too_many.json()["error"]
