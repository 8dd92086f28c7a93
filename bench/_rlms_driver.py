"""One batch through the official RLM library (`rlms`), run by bench/peer.py in the library's
own virtual environment (nothing of FRLM is imported here).

The root model is the simulated model server's scripted root: the question carries one
```repl block, which it sends back as its first reply, so the library's REPL runs exactly
the program FRLM's REPL runs in the same bench: the batch timed around
`llm_query_batched`. The library ends a completion when the program sets
`answer["ready"]`; the answer is "<seconds> <failed>".

    python _rlms_driver.py BASE_URL N LATENCY_MS CONCURRENCY

prints one JSON line: {"elapsed": seconds, "failed": count, "wall": seconds}."""

from __future__ import annotations

import json
import sys
import time

import rlm.core.rlm as rlm_core
from rlm import RLM
from rlm.core.lm_handler import LMHandler


def program(n: int) -> str:
    return (
        "Run this program.\n```repl\nimport time\n"
        f"prompts = ['bench question %d' % i for i in range({n})]\n"
        "t = time.perf_counter()\nrs = llm_query_batched(prompts)\n"
        "elapsed = time.perf_counter() - t\n"
        "failed = sum(r.startswith('Error') for r in rs)\n"
        "answer['content'] = f'{elapsed:.4f} {failed}'\nanswer['ready'] = True\n```"
    )


def main() -> None:
    base_url, n, latency_ms, concurrency = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
    )

    class Handler(LMHandler):
        """The library's handler with its batch concurrency set (16 unless told): the only
        way to set it, as RLM does not pass one through."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("batch_max_concurrent", concurrency)
            super().__init__(*args, **kwargs)

    rlm_core.LMHandler = Handler
    sim = {"extra_body": {"sim": {"latency_ms": latency_ms, "spread": 0}}}
    rlm = RLM(
        backend="openai",
        backend_kwargs={"model_name": "frlm-sim-root", "base_url": base_url, "api_key": "sim"},
        other_backends=["openai"],
        other_backend_kwargs=[
            {
                "model_name": "frlm-sim-worker",
                "base_url": base_url,
                "api_key": "sim",
                "sampling_args": sim,
            }
        ],
        max_iterations=3,
    )
    started = time.perf_counter()
    result = rlm.completion("benchmark", root_prompt=program(n))
    wall = time.perf_counter() - started
    elapsed, failed = result.response.split()
    print(json.dumps({"elapsed": float(elapsed), "failed": int(failed), "wall": wall}))


if __name__ == "__main__":
    main()
