"""Concurrency stress: 16 threads call the core while 4 threads allocate and free.

Callers loop over trim(), rss(), stats() and the glibc knobs (plus, now and then, heap_stats(),
stats(heap=True), malloc_info() and arenas()); churners allocate and free 1-5 MiB and 1-4 KiB
objects. Every result is checked (released >= 0, rss > 0, ...). A hang is caught twice: the
script dumps every thread's stack and exits 3 after --seconds + --grace, and the test that runs it
kills it after a timeout of its own.

    python tests/stress/concurrency.py --seconds 60      # the stress job
    python tests/stress/concurrency.py --seconds 3       # what tests/test_hardening.py runs

Prints a JSON summary (calls per function, errors) and exits 0 when there were no errors.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import random
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable

import memreclaim
from memreclaim import _core

MiB = 1024 * 1024


def check_trim(result: memreclaim.TrimResult) -> None:
    assert isinstance(result, memreclaim.TrimResult), result
    assert result.released is not None and result.released >= 0, result
    assert result.rss_before is not None and result.rss_before > 0, result
    assert result.rss_after is not None and result.rss_after > 0, result
    assert result.anon_before is not None and result.anon_before >= 0, result
    assert result.anon_after is not None and result.anon_after >= 0, result
    assert result.seconds >= 0, result
    assert result.allocator == memreclaim.allocator(), result


def check_stats(result: memreclaim.MemoryStats) -> None:
    assert result.rss > 0, result
    assert result.rss_anon is not None and 0 <= result.rss_anon <= result.rss, result
    assert result.peak_rss is not None and result.peak_rss > 0, result


def check_heap(result: memreclaim.HeapStats) -> None:
    assert result.allocator == memreclaim.allocator(), result
    for value in (result.in_use, result.free, result.mapped):
        assert value is None or value >= 0, result


def knobs_supported() -> bool:
    """Whether the glibc knobs work here (not under another allocator, nor under ASan, which
    defines mallopt itself). Each knob must then behave the same on every call."""
    try:
        memreclaim.set_trim_threshold(128 * 1024)
    except memreclaim.UnsupportedAllocatorError:
        return False
    return True


def knob_calls(supported: bool, rng: random.Random) -> list[tuple[str, Callable[[], None]]]:
    """The knobs with values a service might use; unsupported, each must raise that every time."""
    calls: list[tuple[str, Callable[[], None]]] = [
        (
            "pin_mmap_threshold",
            lambda: memreclaim.pin_mmap_threshold(rng.choice([64, 128, 512]) * 1024),
        ),
        (
            "set_trim_threshold",
            lambda: memreclaim.set_trim_threshold(rng.choice([0, 128, 1024]) * 1024),
        ),
        ("set_arena_max", lambda: _core.set_arena_max(rng.choice([2, 4, 8]))),
    ]
    if supported:
        return calls

    def expect_unsupported(call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                call()
            except memreclaim.UnsupportedAllocatorError:
                return
            raise AssertionError("a glibc knob did not raise UnsupportedAllocatorError")

        return run

    return [(name, expect_unsupported(call)) for name, call in calls]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--churners", type=int, default=4)
    parser.add_argument("--grace", type=float, default=30.0, help="hang watchdog slack, seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    warnings.simplefilter("ignore", RuntimeWarning)
    # A thread stuck past the deadline means a deadlock: dump every stack and exit 3.
    faulthandler.dump_traceback_later(args.seconds + args.grace, exit=True)
    glibc = memreclaim.allocator() == "glibc"
    knobs = knobs_supported()
    try:
        memreclaim.heap_stats()
        has_heap_stats = True
    except memreclaim.UnsupportedAllocatorError:
        has_heap_stats = False
    baseline_rss = memreclaim.rss()
    deadline = 0.0  # set when the threads start (slow set-up, e.g. under valgrind, is not counted)
    counts: Counter[str] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    churned = Counter[str]()

    def caller(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        knob_list = knob_calls(knobs, rng)
        # The heap walkers, now and then (they are slow on purpose: never on a hot path).
        heavy: list[tuple[str, Callable[[], None]]] = [
            ("stats(heap=True)", lambda: check_stats(memreclaim.stats(heap=True))),
            ("heap_stats", lambda: check_heap(memreclaim.heap_stats())),
            ("malloc_info", lambda: assert_xml(memreclaim.glibc.malloc_info())),
            ("arenas", lambda: assert_arenas(memreclaim.glibc.arenas())),
        ]
        if not glibc:  # malloc_info and arenas are glibc's; statistics where there are some
            heavy = (
                heavy[:2]
                if has_heap_stats
                else [("rss", lambda: assert_positive(memreclaim.rss()))]
            )
        light: list[tuple[str, Callable[[], None]]] = [
            ("trim", lambda: check_trim(memreclaim.trim())),
            ("rss", lambda: assert_positive(memreclaim.rss())),
            ("stats", lambda: check_stats(memreclaim.stats())),
            *knob_list,
        ]
        local: Counter[str] = Counter()
        try:
            # At least one call per thread, however late it starts (thread start-up is slow
            # under valgrind): a thread that made none never ran, and that is an error.
            while True:
                name, call = rng.choice(heavy) if rng.random() < 0.05 else rng.choice(light)
                call()
                local[name] += 1
                if time.monotonic() >= deadline:
                    break
        except BaseException as exc:
            with lock:
                errors.append(f"caller {index}: {type(exc).__name__}: {exc}")
        with lock:
            counts.update(local)

    def churner(index: int) -> None:
        rng = random.Random(args.seed * 2000 + index)
        live: list[bytes] = []
        local: Counter[str] = Counter()
        try:
            while not local or time.monotonic() < deadline:  # at least once, as above
                if rng.random() < 0.2:
                    size = rng.randint(1 * MiB, 5 * MiB)
                    local["large"] += 1
                else:
                    size = rng.randint(1024, 4096)
                    local["small"] += 1
                live.append(b"x" * size)  # written, so the pages are resident
                # Keep at most ~40 MiB per thread alive; free at random positions.
                while len(live) > 64 or sum(map(len, live[-16:])) > 40 * MiB:
                    live.pop(rng.randrange(len(live)))
                if rng.random() < 0.3 and live:
                    live.pop(rng.randrange(len(live)))
        except BaseException as exc:
            with lock:
                errors.append(f"churner {index}: {type(exc).__name__}: {exc}")
        with lock:
            churned.update(local)

    threads = [
        threading.Thread(target=caller, args=(i,), name=f"caller-{i}") for i in range(args.callers)
    ]
    threads += [
        threading.Thread(target=churner, args=(i,), name=f"churner-{i}")
        for i in range(args.churners)
    ]
    started = time.monotonic()
    deadline = started + args.seconds
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    faulthandler.cancel_dump_traceback_later()
    final = memreclaim.trim()
    check_trim(final)
    summary = {
        "allocator": memreclaim.allocator(),
        "seconds": round(elapsed, 2),
        "callers": args.callers,
        "churners": args.churners,
        "calls": dict(sorted(counts.items())),
        "total_calls": sum(counts.values()),
        "allocations": dict(churned),
        "baseline_rss": baseline_rss,
        "final_trim": {"released": final.released, "rss_after": final.rss_after},
        "errors": errors,
    }
    if not counts or not all(counts.values()) or not churned:
        errors.append(f"a thread made no call: {dict(counts)}, {dict(churned)}")
    print(json.dumps(summary), flush=True)
    return 1 if errors else 0


def assert_positive(value: int) -> None:
    assert isinstance(value, int) and value > 0, value


def assert_xml(text: str) -> None:
    assert text.startswith("<malloc"), text[:80]


def assert_arenas(arenas: list[memreclaim.glibc.ArenaInfo]) -> None:
    assert arenas and all(arena.mapped >= 0 for arena in arenas), arenas


if __name__ == "__main__":
    sys.exit(main())
