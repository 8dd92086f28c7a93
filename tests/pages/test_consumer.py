"""The run socket against the real ASGI application and the real Redis channel layer:
who may connect, the catch-up after a seq, live batches once each, and gaps filled from
the store."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client

from frlm_web.asgi import application
from frlm_web.redis_client import get_redis
from runs.models import Run
from tests.helpers import bare_run, finish, launch, scripted, trace, wait_until
from traces import consumers, live, store
from traces.emitter import Emitter
from traces.recorder import _write_segment

pytestmark = [pytest.mark.stack]


def run_async(go) -> None:
    """Run a test's coroutine function in a thread of its own: once a browser test has run
    in this session, Playwright's sync API holds an event loop in the main thread, where
    async_to_sync refuses to run."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(async_to_sync(go)).result()


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def socket(run_id: str, cookie: bytes | None, query: str = "") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, f"/ws/runs/{run_id}{query}", headers=headers)


async def receive_events(ws: WebsocketCommunicator, until_seq: int, timeout: float = 10):
    """Every event the socket sends up to seq `until_seq` (and the messages around them)."""
    events, messages = [], []
    while not events or events[-1][0] < until_seq:
        message = await ws.receive_json_from(timeout=timeout)
        messages.append(message)
        events += message.get("events", [])
    return events, messages


def empty_run(owner=None) -> Run:
    return bare_run(
        question="q",
        owner=owner,
    )


def test_it_closes_an_anonymous_socket_with_4401(stack, transactional_db):
    run = empty_run()

    async def go():
        ws = socket(run.id, None, "?after_seq=0")
        connected, _ = await ws.connect()
        assert connected
        assert (await ws.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}

    run_async(go)


def test_it_closes_the_socket_of_a_user_who_may_not_see_the_run_with_4403(stack, transactional_db):
    owner = get_user_model().objects.create_user("owner")
    other = get_user_model().objects.create_user("other")
    run = empty_run(owner)
    other_cookie, owner_cookie = cookie_for(other), cookie_for(owner)

    async def go():
        ws = socket(run.id, other_cookie)
        await ws.connect()
        assert (await ws.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4403}
        ws = socket(run.id, owner_cookie, "?after_seq=0")
        await ws.connect()
        assert (await ws.receive_json_from(timeout=5)) == {"type": "caught_up", "last_seq": 0}
        await ws.disconnect()

    run_async(go)


def test_signing_out_closes_the_sockets_the_session_opened(stack, transactional_db):
    """An open run socket went on sending the run after its browser signed out."""
    owner = get_user_model().objects.create_user("leaver")
    run = empty_run(owner)
    client = Client()
    client.force_login(owner)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def go():
        ws = socket(run.id, cookie, "?after_seq=0")
        await ws.connect()
        assert (await ws.receive_json_from(timeout=5)) == {"type": "caught_up", "last_seq": 0}
        await sync_to_async(client.post, thread_sensitive=False)("/accounts/logout/")
        assert (await ws.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}

    run_async(go)


@pytest.mark.parametrize("ending", ["session_deleted", "password_changed", "deactivated"])
def test_a_session_that_ends_otherwise_closes_its_sockets_soon(
    stack, transactional_db, monkeypatch, ending
):
    monkeypatch.setattr(consumers, "SESSION_CHECK_S", 0.2)
    owner = get_user_model().objects.create_user("lapsed", password="first password")
    run = empty_run(owner)
    cookie = cookie_for(owner)

    def end() -> None:
        if ending == "session_deleted":
            Session.objects.all().delete()
        elif ending == "password_changed":
            owner.set_password("second password")
            owner.save()
        else:
            get_user_model().objects.filter(pk=owner.pk).update(is_active=False)

    async def go():
        ws = socket(run.id, cookie, "?after_seq=0")
        await ws.connect()
        assert (await ws.receive_json_from(timeout=5)) == {"type": "caught_up", "last_seq": 0}
        await sync_to_async(end, thread_sensitive=False)()
        assert (await ws.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}

    run_async(go)


def test_it_sends_the_catch_up_then_each_live_event_once(venues):
    staff = get_user_model().objects.create_user("staff", is_staff=True)
    run = finish(launch(question=scripted("print(1)", "FINAL('ok')")))
    stored = [e["seq"] for e in trace(run)]
    last = stored[-1]
    cookie = cookie_for(staff)

    async def go():
        ws = socket(run.id, cookie, f"?after_seq={last - 5}")
        await ws.connect()
        events, messages = await receive_events(ws, last)
        assert [e[0] for e in events] == stored[-5:]
        assert all(m.get("catch_up") for m in messages)
        done = await ws.receive_json_from(timeout=5)
        assert done == {"type": "caught_up", "last_seq": last}
        assert all(len(e) == len(live.WIRE_FIELDS) for e in events)
        assert not any("_payload" in (e[15] or {}) for e in events)
        # The publisher sends what the consumer already has: nothing goes out again.
        layer = get_channel_layer()
        old = [live.wire(e) for e in store.read_events(run.id, after_seq=last - 3)]
        await layer.group_send(live.group_name(run.id), {"type": "trace.events", "events": old})
        assert await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()

    run_async(go)


def test_it_fills_a_gap_in_the_live_batches_from_the_store(stack, transactional_db):
    user = get_user_model().objects.create_user("watcher")
    run = empty_run(user)
    emitter = Emitter(get_redis(), run.id)

    def event(seq: int) -> dict:
        built = emitter.build("Budget.Alert", "instant", attrs={"n": seq})
        built["seq"] = seq
        return built

    _write_segment(run.id, [event(1), event(2)], first_id="1-0")
    cookie = cookie_for(user)

    async def go():
        ws = socket(run.id, cookie, "?after_seq=0")
        await ws.connect()
        events, _ = await receive_events(ws, 2)
        assert [e[0] for e in events] == [1, 2]
        assert (await ws.receive_json_from(timeout=5))["type"] == "caught_up"
        # Seq 3 and 4 are stored, but the live message carrying 3 was lost: 4 arrives alone.
        _write_segment(run.id, [event(3), event(4)], first_id="2-0")
        layer = get_channel_layer()
        await layer.group_send(
            live.group_name(run.id),
            {"type": "trace.events", "events": [live.wire(event(4))]},
        )
        events, _ = await receive_events(ws, 4)
        assert [e[0] for e in events] == [3, 4]
        # A burst too big for the channel layer comes as a pointer to the store.
        _write_segment(run.id, [event(5), event(6)], first_id="3-0")
        await layer.group_send(
            live.group_name(run.id), {"type": "trace.more", "run_id": run.id, "last_seq": 6}
        )
        events, _ = await receive_events(ws, 6)
        assert [e[0] for e in events] == [5, 6]
        await ws.disconnect()

    run_async(go)


def test_it_ignores_what_it_cannot_read_from_the_page_and_stays_open(stack, transactional_db):
    """A signed-in user's socket that sends text that is not JSON, or JSON nested deeper than
    the parser recurses, is not taken down by it (RecursionError and JSONDecodeError were
    raised out of the consumer, found by a review); its next asking is answered."""
    user = get_user_model().objects.create_user("sender")
    run = empty_run(user)
    emitter = Emitter(get_redis(), run.id)
    first = emitter.build("Budget.Alert", "instant", attrs={"n": 1})
    first["seq"] = 1
    _write_segment(run.id, [first], first_id="1-0")
    cookie = cookie_for(user)

    async def go():
        ws = socket(run.id, cookie)
        connected, _ = await ws.connect()
        assert connected
        # And a seq too big to read (OverflowError, DuckDB's refusal of a 61-digit number:
        # a review).
        big = ('{"after_seq": 1e999}', '{"after_seq": 1' + "0" * 60 + "}")
        for text in ("{not json", "[" * 5000 + "]" * 5000, json.dumps([1, 2]), *big):
            await ws.send_to(text_data=text)
        await ws.send_json_to({"after_seq": 0})
        events, _ = await receive_events(ws, 1)
        assert [e[0] for e in events] == [1]
        await ws.disconnect()

    run_async(go)


def test_it_forwards_what_is_emitted_and_the_recorder_stores_it(stack, transactional_db):
    """The whole path: an emitter's event, read by the forwarder process, published by
    traces.live in that process, through the channel layer to the socket; and stored."""
    user = get_user_model().objects.create_user("watcher")
    run = empty_run(user)
    emitter = Emitter(get_redis(), run.id)
    cookie = cookie_for(user)

    async def go():
        ws = socket(run.id, cookie, "?after_seq=0")
        await ws.connect()
        assert (await ws.receive_json_from(timeout=5))["type"] == "caught_up"
        with emitter.batch():
            for n in range(30):
                emitter.instant("Budget.Alert", attrs={"n": n}, payload=f"secret text {n}")
        events, messages = await receive_events(ws, 30)
        assert [e[0] for e in events] == list(range(1, 31))
        assert all(not m.get("catch_up") for m in messages)  # live, not read back
        assert all(e[14] and "secret" not in json.dumps(e) for e in events)
        await ws.disconnect()

    run_async(go)
    wait_until(lambda: store.event_count(run.id) == 30, what="the events to be stored")


def test_it_sends_events_live_before_the_recorder_stores_them(stack, transactional_db):
    user = get_user_model().objects.create_user("watcher")
    run = empty_run(user)
    emitter = Emitter(get_redis(), run.id)
    cookie = cookie_for(user)
    stack.kill("recorder", signal.SIGTERM)  # nothing is stored while it is down

    async def go():
        ws = socket(run.id, cookie, "?after_seq=0")
        await ws.connect()
        assert (await ws.receive_json_from(timeout=5))["type"] == "caught_up"
        with emitter.batch():
            for n in range(20):
                emitter.instant("Budget.Alert", attrs={"n": n}, payload=f"text {n}")
        events, messages = await receive_events(ws, 20)
        assert [e[0] for e in events] == list(range(1, 21))
        assert all(not m.get("catch_up") for m in messages)
        assert store.event_count(run.id) == 0
        await ws.disconnect()

    try:
        run_async(go)
    finally:
        stack.restart("recorder")
    wait_until(lambda: store.event_count(run.id) == 20, what="the events to be stored")


def test_it_holds_live_events_past_a_gap_until_the_store_has_it(stack, transactional_db):
    """Live events can run ahead of the store: one that follows a gap waits for the
    recorder to store the gap, then both go out, once each and in order. A seq the store
    passes over for good (dead-lettered) does not hold the page back."""
    user = get_user_model().objects.create_user("watcher")
    run = empty_run(user)
    emitter = Emitter(get_redis(), run.id)

    def event(seq: int) -> dict:
        built = emitter.build("Budget.Alert", "instant", attrs={"n": seq})
        built["seq"] = seq
        return built

    _write_segment(run.id, [event(1)], first_id="1-0")
    cookie = cookie_for(user)

    async def go():
        ws = socket(run.id, cookie, "?after_seq=0")
        await ws.connect()
        events, _ = await receive_events(ws, 1)
        assert (await ws.receive_json_from(timeout=5))["type"] == "caught_up"
        layer = get_channel_layer()
        group = live.group_name(run.id)
        await layer.group_send(group, {"type": "trace.events", "events": [live.wire(event(3))]})
        assert await ws.receive_nothing(timeout=0.5)  # 2 is neither live nor stored yet
        _write_segment(run.id, [event(2), event(3)], first_id="2-0")
        events, _ = await receive_events(ws, 3)
        assert [e[0] for e in events] == [2, 3]
        # 4 was dead-lettered: the store goes from 3 to 5.
        await layer.group_send(group, {"type": "trace.events", "events": [live.wire(event(5))]})
        assert await ws.receive_nothing(timeout=0.3)
        _write_segment(run.id, [event(5)], first_id="3-0")
        events, _ = await receive_events(ws, 5)
        assert [e[0] for e in events] == [5]
        await layer.group_send(group, {"type": "trace.events", "events": [live.wire(event(5))]})
        assert await ws.receive_nothing(timeout=0.3)  # never twice
        await ws.disconnect()

    run_async(go)
