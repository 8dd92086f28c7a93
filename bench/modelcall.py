"""Model-call benchmark: CPU of this process per chat completion, the way a venue worker
calls its model (the openai client's post, workers/backends.chat), over httpx's own
transport, over workers/http_transport.KeptAliveTransport with httpx's cookie jar, and as
the product calls (KeptAliveTransport under ModelHTTPClient, no cookie jar), side by side in
one run, with the floor of the same request sent by `http.client` alone (no SDK, no httpx). The
simulated model server answers after 1 ms, in a process of its own; calls run from 1
thread and from 16 (a worker's slots). Each round runs every way once, alternating order.

    .venv/bin/python bench/modelcall.py [--n 2000] [--rounds 3] [--quick]

SIGTERM or SIGINT stops it cleanly: its model server goes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.request import urlopen

from _stack import stop_on_signals

from frlm_web.stack import free_port

BASE = Path(__file__).resolve().parent.parent
BODY = {
    "model": "frlm-sim-worker",
    "messages": [{"role": "user", "content": "Which station is named in this fragment? " * 20}],
    "sim": {"latency_ms": 1},
}


def sdk_way(url: str, transport: str):
    import httpx
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
    """The request alone: one kept-alive http.client connection per thread."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    local = threading.local()
    data = json.dumps(BODY).encode()
    headers = {"content-type": "application/json", "authorization": "Bearer simulated"}

    def call() -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=data, headers=headers)
        reply = json.loads(conn.getresponse().read())
        assert reply["choices"][0]["message"]["content"]

    return call


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
            for i in range(args.rounds):
                order = list(ways) if i % 2 == 0 else list(reversed(ways))
                for name in order:
                    us = cpu_per_call(ways[name], args.n, threads)
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
        for name in ("httpx", "kept-alive", "product", "floor"):
            values = spent[(name, threads)]
            med[name] = statistics.median(values)
            tries = " ".join(f"{v:.0f}" for v in values)
            print(
                f"  {threads:>2} thread(s)  {name:<10} CPU per call: median {med[name]:6.0f} us"
                f"  (rounds: {tries})"
            )
        print(
            f"  {threads:>2} thread(s)  kept-alive / httpx {med['kept-alive'] / med['httpx']:.2f}x,"
            f" product (no cookie jar) / kept-alive {med['product'] / med['kept-alive']:.2f}x,"
            f" product / floor {med['product'] / med['floor']:.2f}x"
        )


if __name__ == "__main__":
    main()
