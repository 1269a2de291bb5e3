"""A short tour of every public call, for valgrind (and anything else slow): tools/valgrind.sh.

Every call once (probe.py), then every discipline case (success and error paths) --calls times,
stats() with tracemalloc on, a fork whose child reads its own RSS, and a short threaded run
(concurrency.py).

    python tests/stress/smoke.py [--calls 200] [--seconds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tracemalloc
import warnings

import concurrency
import discipline
import probe

import memreclaim
from memreclaim import _core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per discipline case")
    parser.add_argument("--seconds", type=float, default=2.0, help="threaded part, seconds")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)

    outcomes = probe.probe()
    calls = len(outcomes)
    for _name, call, _count in discipline.cases(canary=False):
        for _ in range(args.calls):
            with contextlib.suppress(Exception):
                call()
        calls += args.calls

    with open("/proc/sys/kernel/pid_max") as f:
        missing = int(f.read())  # never a process
    readers = (
        _core.process_status,
        _core.process_rollup,
        _core.process_heap_mapping,
        _core.process_identity,
    )
    for reader in readers:
        for _ in range(args.calls):
            for pid in (os.getpid(), missing, 0, "1"):
                with contextlib.suppress(Exception):
                    reader(pid)
        calls += 4 * args.calls
    # mimalloc's heap walk: its argument errors, and its answer under another allocator.
    for walk_args in ((64 * 1024, 1000), ("64", 1), (1, 0), (-1, 1), (1,)):
        for _ in range(args.calls):
            with contextlib.suppress(Exception):
                _core.mimalloc_areas(*walk_args)
        calls += args.calls

    tracemalloc.start()  # stats() then reads tracemalloc's totals (a tuple it must not leak)
    for _ in range(args.calls):
        assert memreclaim.stats().traced_current is not None
    tracemalloc.stop()
    calls += args.calls

    pid = os.fork()
    if pid == 0:
        code = 0 if memreclaim.rss() > 0 and memreclaim.trim().released is not None else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        print(f"forked child failed: status {status}", file=sys.stderr)
        return 1

    threaded = concurrency.main(
        ["--seconds", str(args.seconds), "--callers", "4", "--churners", "2", "--grace", "600"]
    )
    print(json.dumps({"smoke_calls": calls, "allocator": memreclaim.allocator()}), flush=True)
    return threaded


if __name__ == "__main__":
    sys.exit(main())
