"""Refcount and allocation discipline: call each public function many times, check nothing grows.

For every (function, arguments) case, on its success path and its error paths: warm up, collect,
take sys.getallocatedblocks(), len(gc.get_objects()) and the reference counts of the objects the
C core hands out or raises (None, True, False, the allocator name, the result types, the
exception class); make N calls; collect; take them again. A reference or object leaked per call
shows up as a growth of about N; the limits are small constants.

    python tests/stress/discipline.py [--scale 1.0] [--canary] [--only NAME]

Prints one JSON line per case and exits 1 when a case grew past the limits. --canary adds a case
that leaks on purpose (one list entry per call), which must be reported: proof the check can fail.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from typing import Any

import memreclaim
from memreclaim import _core

# Growth limits over a whole case (not per call). A leak of one block or one reference per call
# grows by ~N (>= 20,000 here). Measured noise: under 60 blocks for the C calls, 100-230 for the
# XML-parsing Python wrappers (expat/ElementTree state), not growing with N.
BLOCKS_LIMIT = 1000
OBJECTS_LIMIT = 50
REFS_LIMIT = 200

FULL = 100_000
# arenas() and memreclaim.glibc.set_arena_max() parse malloc_info()'s XML in Python (~60 us a call):
# 20,000 calls keep the case at ~1 s; the C malloc_info() under them gets the full 100,000.
XML = 20_000

_leaked: list[object] = []
# The error-path cases call with wrong types on purpose: through Any, so mypy lets them.
loose: Any = memreclaim
loose_core: Any = _core


def _canary() -> int:
    _leaked.append(object())
    return memreclaim.rss()


def _canary_ref() -> int:
    # One block for the whole list, one reference per call. A heap type, not True: None, True
    # and False are immortal from 3.12 on (their reference counts never move).
    _leaked.append(memreclaim.TrimResult)
    return memreclaim.rss()


def cases(canary: bool) -> list[tuple[str, Callable[[], object], int]]:
    """(name, zero-argument call, number of calls). Error-path calls raise; that is the point."""
    # Without glibc the knobs, heap_stats and malloc_info raise UnsupportedAllocatorError: the
    # same cases then run that error path.
    mmap_threshold = 128 * 1024
    result: list[tuple[str, Callable[[], object], int]] = [
        ("trim()", memreclaim.trim, FULL),
        ("trim(pools=False)", lambda: memreclaim.trim(pools=False), FULL),
        ("trim(pools=True)", lambda: memreclaim.trim(pools=True), FULL),
        ("trim(pools='no') TypeError", lambda: loose.trim(pools="no"), FULL),
        ("trim(1) TypeError", lambda: loose.trim(1), FULL),
        ("trim(bogus=1) TypeError", lambda: loose.trim(bogus=1), FULL),
        ("rss()", memreclaim.rss, FULL),
        ("rss(1) TypeError", lambda: loose.rss(1), FULL),
        ("stats()", memreclaim.stats, FULL),
        ("stats(heap=True)", lambda: memreclaim.stats(heap=True), FULL),
        ("stats(heap=None) TypeError", lambda: loose.stats(heap=None), FULL),
        ("stats(x=1) TypeError", lambda: loose.stats(x=1), FULL),
        ("heap_stats()", memreclaim.heap_stats, FULL),
        ("heap_stats(1) TypeError", lambda: loose.heap_stats(1), FULL),
        ("allocator()", memreclaim.allocator, FULL),
        ("allocator(1) TypeError", lambda: loose.allocator(1), FULL),
        ("allocator_version()", memreclaim.allocator_version, FULL),
        ("allocator_version(x=1) TypeError", lambda: loose.allocator_version(x=1), FULL),
        (
            "pin_mmap_threshold(128 KiB)",
            lambda: memreclaim.pin_mmap_threshold(mmap_threshold),
            FULL,
        ),
        ("pin_mmap_threshold(0) ValueError", lambda: memreclaim.pin_mmap_threshold(0), FULL),
        (
            "pin_mmap_threshold(2**80) OverflowError",
            lambda: memreclaim.pin_mmap_threshold(2**80),
            FULL,
        ),
        ("pin_mmap_threshold(True) TypeError", lambda: memreclaim.pin_mmap_threshold(True), FULL),
        ("pin_mmap_threshold('1') TypeError", lambda: loose.pin_mmap_threshold("1"), FULL),
        (
            "set_trim_threshold(128 KiB)",
            lambda: memreclaim.set_trim_threshold(mmap_threshold),
            FULL,
        ),
        ("set_trim_threshold(-1) ValueError", lambda: memreclaim.set_trim_threshold(-1), FULL),
        ("set_trim_threshold(1.5) TypeError", lambda: loose.set_trim_threshold(1.5), FULL),
        ("_core.set_arena_max(8)", lambda: _core.set_arena_max(8), FULL),
        ("_core.set_arena_max(0) ValueError", lambda: _core.set_arena_max(0), FULL),
        ("_core.set_arena_max(-2**70) OverflowError", lambda: _core.set_arena_max(-(2**70)), FULL),
        ("memreclaim.glibc.set_arena_max(8)", lambda: memreclaim.glibc.set_arena_max(8), XML),
        ("memreclaim.glibc.set_arena_max(None) TypeError", lambda: loose.set_arena_max(None), FULL),
        ("malloc_info()", memreclaim.glibc.malloc_info, FULL),
        ("malloc_info(1) TypeError", lambda: loose.malloc_info(1), FULL),
        ("arenas()", memreclaim.glibc.arenas, XML),
        ("parse_bytes('1.5 MiB')", lambda: memreclaim.units.parse_bytes("1.5 MiB"), FULL),
        ("parse_bytes('1 XB') ValueError", lambda: memreclaim.units.parse_bytes("1 XB"), FULL),
        ("parse_bytes(None) TypeError", lambda: loose.parse_bytes(None), FULL),
        ("format_bytes(3 << 20)", lambda: memreclaim.units.format_bytes(3 << 20), FULL),
        ("format_bytes('x') TypeError", lambda: loose.format_bytes("x"), FULL),
    ]
    if canary:
        result.append(("canary: leaks one object per call", _canary, FULL))
        result.append(("canary: leaks one reference to TrimResult per call", _canary_ref, FULL))
    return result


def watched() -> dict[str, object]:
    """Objects whose reference counts a missing Py_DECREF in the core would raise. None, True,
    False and the static exception types are immortal from 3.12 on (their counts never move):
    there the heap types and the allocator name carry the check."""
    return {
        "None": None,
        "True": True,
        "False": False,
        "allocator name": memreclaim.allocator(),
        "TrimResult": memreclaim.TrimResult,
        "MemoryStats": memreclaim.MemoryStats,
        "HeapStats": memreclaim.HeapStats,
        "UnsupportedAllocatorError": memreclaim.UnsupportedAllocatorError,
        "TypeError": TypeError,
        "ValueError": ValueError,
        "OverflowError": OverflowError,
    }


def snapshot(objects: dict[str, object]) -> dict[str, int]:
    gc.collect()
    figures = {"blocks": sys.getallocatedblocks(), "objects": len(gc.get_objects())}
    for name, obj in objects.items():
        figures["refs " + name] = sys.getrefcount(obj)
    return figures


def run_case(call: Callable[[], object], calls: int) -> tuple[dict[str, int], str, float]:
    outcome = "ok"
    for _ in range(min(1000, calls)):  # warm-up: caches, interned strings, warning registry
        try:
            call()
        except Exception as exc:
            outcome = type(exc).__name__
    objects = watched()
    before = snapshot(objects)
    started = time.perf_counter()
    for _ in range(calls):
        with contextlib.suppress(Exception):
            call()
    seconds = time.perf_counter() - started
    after = snapshot(objects)
    del objects
    return {key: after[key] - before[key] for key in before}, outcome, seconds


def over_limit(growth: dict[str, int]) -> list[str]:
    bad = []
    for key, value in growth.items():
        limit = (
            BLOCKS_LIMIT if key == "blocks" else OBJECTS_LIMIT if key == "objects" else REFS_LIMIT
        )
        if abs(value) > limit:
            bad.append(f"{key} {value:+d} (limit {limit})")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every call count")
    parser.add_argument("--canary", action="store_true", help="add a case that leaks on purpose")
    parser.add_argument("--only", default="", help="run only cases whose name starts with this")
    parser.add_argument("--tracemalloc", action="store_true", help="trace while calling")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)  # set_arena_max's "late" warning
    if args.tracemalloc:
        tracemalloc.start()  # stats() then takes its traced-memory branch
    failed = 0
    total_calls = 0
    started = time.perf_counter()
    for name, call, count in cases(args.canary):
        if not name.startswith(args.only):
            continue
        calls = max(1, int(count * args.scale))
        growth, outcome, seconds = run_case(call, calls)
        bad = over_limit(growth)
        failed += bool(bad)
        total_calls += calls
        line = {"case": name, "calls": calls, "outcome": outcome, "seconds": round(seconds, 3)}
        line.update(growth=growth, over=bad)
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "summary": True,
                "allocator": memreclaim.allocator(),
                "calls": total_calls,
                "seconds": round(time.perf_counter() - started, 2),
                "failed": failed,
            }
        ),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
