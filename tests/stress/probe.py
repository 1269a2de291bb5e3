"""Call every public function of memreclaim once and print the outcomes as JSON.

Used by tests/test_hardening.py's fault tests: the test runs this script in a subprocess under a
fault (no /proc, an unknown allocator, a hidden symbol) and asserts on the JSON. A crash is a
non-zero exit (a signal), which the test reports with the script's stderr.

    python tests/stress/probe.py            # prints one JSON object on the last line of stdout
"""

from __future__ import annotations

import ctypes
import json
import sys
import warnings
from collections.abc import Callable
from typing import Any

import memreclaim
from memreclaim import _core


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """{"ok": value} or {"exc": type name, "msg": text, "errno": n, "filename": f}."""
    try:
        value = call()
    except BaseException as exc:
        result: dict[str, Any] = {"exc": type(exc).__name__, "msg": str(exc)}
        if isinstance(exc, OSError):
            result["errno"] = exc.errno
            result["filename"] = exc.filename
        return result
    return {"ok": jsonable(value)}


def jsonable(value: Any) -> Any:
    """Struct sequences become dicts of their fields; other values pass through or become repr."""
    if isinstance(value, memreclaim.TrimResult | memreclaim.MemoryStats | memreclaim.HeapStats):
        return {
            name: jsonable(getattr(value, name))
            for name in getattr(type(value), "__match_args__", ())
        }
    if isinstance(value, list):
        return [jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def probe() -> dict[str, Any]:
    """Every public call of the core API, on its success path and one error path each."""
    warnings.simplefilter("ignore", RuntimeWarning)  # set_arena_max's "late" warning
    calls: dict[str, Callable[[], Any]] = {
        "allocator": memreclaim.allocator,
        "allocator_version": memreclaim.allocator_version,
        "trim": memreclaim.trim,
        "rss": memreclaim.rss,
        "stats": memreclaim.stats,
        "stats_heap": lambda: memreclaim.stats(heap=True),
        "heap_stats": memreclaim.heap_stats,
        "malloc_info": lambda: memreclaim.glibc.malloc_info()[:40],
        "arenas": lambda: len(memreclaim.glibc.arenas()),
        "mimalloc_areas": lambda: sorted(
            memreclaim.asdict(_core.mimalloc_areas(64 * 1024, 1_000_000))
        ),
        # What the process exports, whatever memreclaim's lookups are made to miss.
        "mimalloc_walk_exported": lambda: all(
            hasattr(ctypes.CDLL(None), name)
            for name in ("mi_heap_get_backing", "mi_heap_visit_blocks")
        ),
        "pin_mmap_threshold": lambda: memreclaim.pin_mmap_threshold(128 * 1024),
        "set_trim_threshold": lambda: memreclaim.set_trim_threshold(128 * 1024),
        "core_set_arena_max": lambda: _core.set_arena_max(8),
        "set_arena_max": lambda: memreclaim.glibc.set_arena_max(8),
        "bad_pin_type": lambda: memreclaim.pin_mmap_threshold("64 KiB"),  # type: ignore[arg-type]
        "bad_pin_value": lambda: memreclaim.pin_mmap_threshold(0),
        "bad_trim_threshold": lambda: memreclaim.set_trim_threshold(-1),
        "bad_arena_max": lambda: _core.set_arena_max(2**64),
        "bad_trim_flag": lambda: memreclaim.trim(pools="yes"),  # type: ignore[arg-type]
        "bad_stats_flag": lambda: memreclaim.stats(heap=1),  # type: ignore[arg-type]
    }
    return {name: outcome(call) for name, call in calls.items()}


if __name__ == "__main__":
    sys.stdout.write(json.dumps(probe()) + "\n")
