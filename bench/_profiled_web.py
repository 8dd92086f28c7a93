"""The web server (frlm_web/web_server.py, daphne) under cProfile, for `bench/federation.py
--profile-web FILE`: the profile of the web process's event loop (where the gateway's
consumers run) over the batches a bench chooses.

    python bench/_profiled_web.py FILE <daphne's arguments>

SIGUSR1 starts collecting; SIGUSR2 stops and writes what was collected to FILE (pstats).
Only the main thread is profiled: the event loop's work, not the threads that
`sync_to_async` hands database calls to (their CPU is in the bench's per-thread figures).
Times are the thread's CPU time, not wall time: on a loaded machine a system call that
wakes another process (a socket's send to Redis) is charged, by a wall clock, with the time
this process then waits for a core.
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time


def main() -> None:
    out = sys.argv[1]
    profile = cProfile.Profile(time.thread_time)

    def start(_signum: int, _frame: object) -> None:
        profile.enable()

    def stop(_signum: int, _frame: object) -> None:
        profile.disable()
        profile.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["daphne", *sys.argv[2:]]
    from frlm_web.web_server import main as serve  # noqa: PLC0415 - after the argv is set

    serve()


if __name__ == "__main__":
    main()
