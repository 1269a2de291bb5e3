"""Fork and interpreter exit while memreclaim is busy in other threads.

    python tests/stress/lifecycle.py fork [--forks 30]   # fork repeatedly mid-trim
    python tests/stress/lifecycle.py exit                # exit with everything still running

fork: a BackgroundTrimmer trimming every millisecond, 4 threads calling trim()/stats()/rss(), 2
threads allocating and freeing 1-5 MiB; the main thread forks --forks times. Each child must
read its own RSS, trim, allocate, run a trimmer of its own briefly and exit 0 within 20 s (a child
stuck on a lock inherited from the parent is killed and counted as hung). Prints a JSON summary.

exit: the same threads (daemon), plus an asyncio Watchdog on a loop in another daemon thread, and
the main thread returns while they are inside trim(): the interpreter must exit 0, silently.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
import warnings

import memreclaim
from memreclaim.watchdog import BackgroundTrimmer, Watchdog

MiB = 1024 * 1024


def busy_threads(stop: threading.Event, daemon: bool) -> list[threading.Thread]:
    def caller(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            choice = rng.random()
            if choice < 0.5:
                assert memreclaim.trim().released is not None
            elif choice < 0.8:
                assert memreclaim.stats().rss > 0
            else:
                assert memreclaim.rss() > 0

    def churner(seed: int) -> None:
        rng = random.Random(seed)
        live: list[bytes] = []
        while not stop.is_set():
            live.append(b"x" * rng.randint(MiB, 5 * MiB))
            if len(live) > 8:
                live.pop(rng.randrange(len(live)))

    threads = [threading.Thread(target=caller, args=(i,), daemon=daemon) for i in range(4)]
    threads += [threading.Thread(target=churner, args=(i,), daemon=daemon) for i in range(2)]
    for thread in threads:
        thread.start()
    return threads


def child() -> int:
    """In a forked child: everything must work, on this process's own figures."""
    assert memreclaim.rss() > 0
    result = memreclaim.trim()
    assert result.released is not None and result.released >= 0
    blob = b"y" * (10 * MiB)
    del blob
    memreclaim.trim()
    trimmer = BackgroundTrimmer(interval=0.001, slack="1 MiB", min_interval=0.001)
    trimmer.start()
    time.sleep(0.02)
    trimmer.stop()
    return 0


def fork_mode(forks: int) -> int:
    stop = threading.Event()
    trimmer = BackgroundTrimmer(interval=0.001, slack="1 MiB", min_interval=0.001)
    trimmer.start()
    threads = busy_threads(stop, daemon=False)
    ok = hung = failed = 0
    for _ in range(forks):
        time.sleep(random.uniform(0.0, 0.02))
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child()
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ok += status == 0
                failed += status != 0
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.005)
    stop.set()
    for thread in threads:
        thread.join()
    trims = trimmer.counters.trims
    trimmer.stop()
    print(json.dumps({"forks": forks, "ok": ok, "failed": failed, "hung": hung, "trims": trims}))
    return 0 if ok == forks else 1


def exit_mode() -> int:
    stop = threading.Event()  # never set: the interpreter exits under the threads
    trimmer = BackgroundTrimmer(interval=0.001, slack="1 MiB", min_interval=0.001)
    trimmer.start()

    def loop_thread() -> None:
        async def main() -> None:
            async with Watchdog(interval=0.001, slack="1 MiB", min_interval=0.001):
                while True:
                    await asyncio.sleep(0.001)

        asyncio.run(main())

    threading.Thread(target=loop_thread, daemon=True).start()
    busy_threads(stop, daemon=True)
    time.sleep(0.2)
    print(json.dumps({"exiting": True, "trims": trimmer.counters.trims}), flush=True)
    return 0


if __name__ == "__main__":
    warnings.simplefilter("default")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["fork", "exit"])
    parser.add_argument("--forks", type=int, default=30)
    args = parser.parse_args()
    sys.exit(fork_mode(args.forks) if args.mode == "fork" else exit_mode())
