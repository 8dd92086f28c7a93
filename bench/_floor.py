"""One process of the harness floor (bench/fanout.py harness_floor): `slots` threads, each
with its own HTTP client, send `n` chat completions of `latency_ms` straight to the
simulated model at `url`. It loads its libraries, says "ready", waits for "go" on stdin,
and prints "done" when its last reply is in (the caller times from go to the last done),
or "failed: ..." with the first error.

    python bench/_floor.py URL N SLOTS LATENCY_MS
"""

from __future__ import annotations

import queue
import sys
import threading

import httpx


def main() -> None:
    url, n, slots, latency_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    jobs: queue.Queue[int] = queue.Queue()
    for i in range(n):
        jobs.put(i)
    errors: list[str] = []

    # A client per slot, as each worker slot keeps its own connection, made before the
    # clock starts as a worker's are: making one loads certificates (about 30 ms of CPU),
    # and 32 made inside the measure started the last slot a second late.
    clients = [httpx.Client() for _ in range(slots)]

    def slot(client: httpx.Client) -> None:
        # A request that fails on a loaded machine is sent again, so the floor counts
        # every sub-query.
        with client:
            while True:
                try:
                    i = jobs.get_nowait()
                except queue.Empty:
                    return
                body = {
                    "model": "frlm-sim-worker",
                    "sim": {"latency_ms": latency_ms},
                    "messages": [{"role": "user", "content": f"bench question {i}"}],
                }
                for tries_left in (2, 1, 0):
                    try:
                        client.post(url, json=body).raise_for_status()
                        break
                    except httpx.HTTPError as exc:
                        if not tries_left:
                            errors.append(str(exc))

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    threads = [threading.Thread(target=slot, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"failed: {len(errors)} requests, first: {errors[0]}" if errors else "done", flush=True)


if __name__ == "__main__":
    main()
