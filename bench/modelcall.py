"""Model-call benchmark: CPU of this process per chat completion, the way a venue worker
calls its model (the openai client's post, workers/backends.chat), over httpx's own
transport, over workers/http_transport.KeptAliveTransport with httpx's cookie jar, and as
the product calls (KeptAliveTransport under ModelHTTPClient, no cookie jar), side by side in
one run, with the floor of the same request sent by workers/http11.py alone (no SDK, no
httpx). The simulated model server answers after 1 ms, in a process of its own; calls run from 1
thread and from 16 (a worker's slots). Each round runs every way once, alternating order.

Beside them, what an asyncio worker (one event loop, its slots as tasks) would pay: the
openai client's AsyncOpenAI over httpx's own async transport, the same over a minimal
transport on asyncio streams (so what is left is the SDK's and httpx's own layers), and the
bare request on asyncio streams (the floor of any asyncio worker).

    .venv/bin/python bench/modelcall.py [--n 2000] [--rounds 3] [--quick]

SIGTERM or SIGINT stops it cleanly: its model server goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.request import urlopen

import httpx
from _stack import stop_on_signals

from frlm_web.stack import free_port

BASE = Path(__file__).resolve().parent.parent
BODY = {
    "model": "frlm-sim-worker",
    "messages": [{"role": "user", "content": "Which station is named in this fragment? " * 20}],
    "sim": {"latency_ms": 1},
}


def sdk_way(url: str, transport: str):
    import openai

    from workers.http_transport import KeptAliveTransport, ModelHTTPClient

    kept = KeptAliveTransport() if transport != "httpx" else None
    # "product": the client workers/backends.py makes (kept-alive, no cookie jar); the
    # other two keep httpx's cookie jar, as the product did before.
    make = ModelHTTPClient if transport == "product" else httpx.Client
    client = openai.OpenAI(
        base_url=url,
        api_key="simulated",
        timeout=30,
        max_retries=1,
        http_client=make(
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            timeout=30,
            transport=kept,
        ),
    )

    def call() -> None:
        reply = client.post("/chat/completions", body=BODY, cast_to=httpx.Response).json()
        assert reply["choices"][0]["message"]["content"]

    return call


def floor_way(url: str):
    """The request alone: one kept-alive connection per thread, of the kind the product's
    transport holds (workers/http11.py: a send and a read; `http.client` cost 2.5 times
    twice its CPU for the same exchange, 174-179 against 77-94 µs a call)."""
    from workers.http11 import Connection

    port = int(url.rsplit(":", 1)[1].split("/")[0])
    local = threading.local()
    data = json.dumps(BODY).encode()
    headers = [
        (b"Host", f"127.0.0.1:{port}".encode()),
        (b"Content-Type", b"application/json"),
        (b"Authorization", b"Bearer simulated"),
        (b"Content-Length", str(len(data)).encode()),
    ]

    def call() -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = Connection("127.0.0.1", port)
            conn.open(30)
        reply = conn.exchange("POST", "/v1/chat/completions", headers, data, 30)
        assert json.loads(reply.content)["choices"][0]["message"]["content"]
        if reply.will_close:
            conn.close()
            local.conn = None

    return call


class StreamsTransport(httpx.AsyncBaseTransport):
    """A minimal httpx async transport over asyncio streams, for this bench only: one
    request at a time per connection, idle connections kept, replies read by their
    Content-Length. It measures what the openai client costs above any transport."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        body = await request.aread()
        head = "".join(
            f"{name.decode()}: {value.decode()}\r\n" for name, value in request.headers.raw
        )
        target = request.url.raw_path.decode()
        writer.write(f"{request.method} {target} HTTP/1.1\r\n{head}\r\n".encode() + body)
        status, headers, content = await read_reply(reader)
        self.idle.append((reader, writer))
        return httpx.Response(status, headers=headers, content=content)


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]], bytes]:
    """An HTTP/1.1 reply with a Content-Length: its status, headers and body."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = [tuple(line.split(": ", 1)) for line in lines[1:] if line]
    length = next(int(v) for k, v in headers if k.lower() == "content-length")
    return int(lines[0].split()[1]), headers, await reader.readexactly(length)


def async_sdk_way(url: str, transport: str):
    """AsyncOpenAI's post, made inside the event loop that runs it (its connections belong
    to that loop)."""

    def make():
        import openai

        port = int(url.rsplit(":", 1)[1].split("/")[0])
        client = openai.AsyncOpenAI(
            base_url=url,
            api_key="simulated",
            timeout=30,
            max_retries=1,
            http_client=httpx.AsyncClient(
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
                timeout=30,
                transport=StreamsTransport(port) if transport == "streams" else None,
            ),
        )

        async def call() -> None:
            http = await client.post("/chat/completions", body=BODY, cast_to=httpx.Response)
            assert http.json()["choices"][0]["message"]["content"]

        return call

    return make


def async_floor_way(url: str):
    """The request alone on asyncio streams: one kept-alive connection per task."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    data = json.dumps(BODY).encode()
    request = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        "content-type: application/json\r\nauthorization: Bearer simulated\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data

    def make():
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

        async def call() -> None:
            reader, writer = (
                idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
            )
            writer.write(request)
            _status, _headers, body = await read_reply(reader)
            idle.append((reader, writer))
            assert json.loads(body)["choices"][0]["message"]["content"]

        return call

    return make


def cpu_per_call_async(make, n: int, tasks: int) -> float:
    """CPU microseconds of this process per call, `n` calls over `tasks` tasks of one event
    loop."""
    each = n // tasks

    async def measure() -> float:
        call = make()

        async def run(k: int) -> None:
            for _ in range(k):
                await call()

        await asyncio.gather(*[run(min(20, each)) for _ in range(tasks)])  # connections up
        started = time.process_time()
        await asyncio.gather(*[run(each) for _ in range(tasks)])
        return (time.process_time() - started) * 1e6 / (each * tasks)

    return asyncio.run(measure())


def cpu_per_call(call, n: int, threads: int) -> float:
    """CPU microseconds of this process per call, `n` calls over `threads` threads."""
    each = n // threads
    for _ in range(min(20, each)):  # every thread's connection up before the clock
        call()

    def run() -> None:
        for _ in range(each):
            call()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    started = time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.process_time() - started) * 1e6 / (each * threads)


# The ways, as printed: the four a thread calls with, then the three of an event loop.
NAMES = ("httpx", "kept-alive", "product", "floor", "async-httpx", "async-sdk", "async-floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per way, round and threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="400 calls, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds = 400, 2
    if args.n < 16 or args.rounds < 1:
        parser.error("--n must be at least 16 and --rounds at least 1")
    stop_on_signals()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(BASE / "manage.py"), "frlm_simserver", "--port", str(port)],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "frlm_web.settings"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(200):
            try:
                urlopen(f"{url}/models", timeout=1).read()  # noqa: S310 (loopback)
                break
            except OSError:
                time.sleep(0.1)
        spent: dict[tuple[str, int], list[float]] = {}
        for threads in (1, 16):
            ways = {
                "httpx": sdk_way(url, "httpx"),
                "kept-alive": sdk_way(url, "kept-alive"),
                "product": sdk_way(url, "product"),
                "floor": floor_way(url),
            }
            async_ways = {
                "async-httpx": async_sdk_way(url, "httpx"),
                "async-sdk": async_sdk_way(url, "streams"),
                "async-floor": async_floor_way(url),
            }
            for i in range(args.rounds):
                order = [*ways, *async_ways]
                for name in order if i % 2 == 0 else reversed(order):
                    if name in ways:
                        us = cpu_per_call(ways[name], args.n, threads)
                    else:
                        us = cpu_per_call_async(async_ways[name], args.n, threads)
                    spent.setdefault((name, threads), []).append(us)
    finally:
        server.terminate()
        server.wait(10)
    print(
        f"model-call benchmark: {args.n} chat completions per way and round, "
        f"{args.rounds} rounds, simulated model at 1 ms"
    )
    for threads in (1, 16):
        med = {}
        for name in NAMES:
            values = spent[(name, threads)]
            med[name] = statistics.median(values)
            tries = " ".join(f"{v:.0f}" for v in values)
            runs_on = "task(s)  " if name.startswith("async") else "thread(s)"
            print(
                f"  {threads:>2} {runs_on}  {name:<11} CPU per call: median {med[name]:6.0f} us"
                f"  (rounds: {tries})"
            )
        print(
            f"  {threads:>2} thread(s)  kept-alive / httpx {med['kept-alive'] / med['httpx']:.2f}x,"
            f" product (no cookie jar) / kept-alive {med['product'] / med['kept-alive']:.2f}x,"
            f" product / floor {med['product'] / med['floor']:.2f}x"
        )
        print(
            f"  {threads:>2} task(s)    async-sdk / product"
            f" {med['async-sdk'] / med['product']:.2f}x,"
            f" async-httpx / async-sdk {med['async-httpx'] / med['async-sdk']:.2f}x,"
            f" async-sdk / async-floor {med['async-sdk'] / med['async-floor']:.2f}x;"
            f" the openai client's own layers: {med['async-sdk'] - med['async-floor']:.0f} us"
            f" (async), {med['product'] - med['floor']:.0f} us (threads)"
        )


if __name__ == "__main__":
    main()
