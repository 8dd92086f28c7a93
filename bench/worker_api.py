"""Worker API benchmark: what registration and heartbeats cost a worker and the server.

Prints, measured in one run against a private daphne, Redis and database: the mean time of
a registration over HTTP, of a signed heartbeat over HTTP and of the same heartbeat
in-process (the services directly), their ratio, and the cost of signing and of checking
one sub-query result (what every result adds to a worker and to the conductor).

    .venv/bin/python bench/worker_api.py [--beats 300] [--registrations 30]
"""

from __future__ import annotations

import argparse
import time

from _stack import private_stack, stop_on_signals

from frlm_web.stack import free_port, web_proc


def mean_ms(fn, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) * 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--beats", type=int, default=300)
    parser.add_argument("--registrations", type=int, default=30)
    parser.add_argument("--results", type=int, default=5000)
    args = parser.parse_args()
    stop_on_signals()

    from django.conf import settings

    from workers import keys
    from workers.client import HttpControl, LocalControl
    from workers.models import Venue
    from workers.services import token_create
    from workers.signing import result_sign, result_verify

    with private_stack([]) as stack:
        port = free_port()
        stack.launch(web_proc(port))
        stack.wait_ready(stack.procs["web"], 60)
        venue, _ = Venue.objects.get_or_create(name="benchapi", defaults={"kind": "edge"})
        _, token = token_create(venue)

        def registration(i: int, key) -> dict:
            return {
                "name": f"bench-{i}",
                "venue": "benchapi",
                "models": [],
                "concurrency": 8,
                "public_key": keys.public_b64(key),
            }

        key = keys.generate()
        http = HttpControl(f"http://127.0.0.1:{port}", token, key)
        register_ms = mean_ms(
            lambda i: http.register(registration(i, keys.generate())), args.registrations
        )
        worker_id = http.register(registration(10_000, key))["worker_id"]
        figures = {"inflight": 3, "memory_mb": 150.0, "latency_ms": 210.0}
        # The API refuses a worker more than FRLM_API_HEARTBEAT_LIMIT beats a window: the
        # beats go round a pool of workers, each well within it, all signing with `key`.
        each = max(1, settings.FRLM_API_HEARTBEAT_LIMIT // 2)
        beaters = [worker_id] + [
            http.register(registration(10_001 + i, key))["worker_id"]
            for i in range(-(-args.beats // each) - 1)
        ]
        for beater in beaters:
            http.heartbeat(beater, figures)
        http_ms = mean_ms(lambda i: http.heartbeat(beaters[i % len(beaters)], figures), args.beats)

        local = LocalControl(token)
        local_id = local.register(registration(20_000, keys.generate()))["worker_id"]
        local.heartbeat(local_id, figures)
        local_ms = mean_ms(lambda i: local.heartbeat(local_id, figures), args.beats)

        result = {
            "run_id": "rbench",
            "sq_id": "1.1",
            "worker_id": worker_id,
            "status": "ok",
            "text": "The launch window opens at 06:00 UTC. " * 20,
            "tokens_in": 900,
            "tokens_out": 40,
        }
        public = keys.public_b64(key)
        sign_us = mean_ms(lambda i: result_sign(key, result), args.results) * 1000
        signed = {**result, "sig": result_sign(key, result)}
        verify_us = mean_ms(lambda i: result_verify(signed, public), args.results) * 1000
        http.close()

    print(f"registration over HTTP        {register_ms:8.2f} ms  (mean of {args.registrations})")
    print(f"signed heartbeat over HTTP    {http_ms:8.2f} ms  (mean of {args.beats})")
    print(f"heartbeat in-process          {local_ms:8.2f} ms  (mean of {args.beats})")
    print(f"HTTP / in-process             {http_ms / local_ms:8.1f} x")
    print(f"sign one result               {sign_us:8.1f} us")
    print(f"verify one result             {verify_us:8.1f} us")
    # daphne answers one request at a time per process: this many workers beating once a
    # second would keep one web process busy with heartbeats alone.
    print(f"workers per web process at 1 beat/s {1000 / http_ms:8.0f}")


if __name__ == "__main__":
    main()
