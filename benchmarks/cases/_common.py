"""Shared helpers for the case scripts (each runs in its own fresh interpreter)."""

from __future__ import annotations

import gc
import json
import os
import platform
import sys
from collections.abc import Iterable
from typing import Any

import memreclaim

PAGE = os.sysconf("SC_PAGESIZE")
GC_HEADER = 16  # PyGC_Head before a GC-tracked object on 64-bit CPython 3.8+


def live_floors(objects: Iterable[object]) -> tuple[int, int]:
    """(bytes, bytes of distinct pages) that ``objects`` occupy, from their addresses.

    CPython's ``id()`` is the object's address; ``sys.getsizeof`` includes the GC header, which
    sits just before the address for GC-tracked objects.
    """
    total = 0
    pages: set[int] = set()
    for obj in objects:
        size = sys.getsizeof(obj)
        start = id(obj) - (GC_HEADER if type(obj) in (tuple, list, dict) else 0)
        total += size
        pages.update(range(start // PAGE, (start + size - 1) // PAGE + 1))
    return total, len(pages) * PAGE


def trim_and_emit(
    *, base: int, peak: int, build: float, live_objects: list[object], pools: bool = False
) -> None:
    """After the free: read RSS, the floors of ``live_objects``, trim, read RSS, emit it all."""
    gc.collect()
    freed = memreclaim.rss()
    live, pages = live_floors(live_objects)
    result = memreclaim.trim(pools=pools)
    emit(
        baseline=base,
        peak=peak,
        after_free=freed,
        after_trim=memreclaim.rss(),
        physical_floor=base + live,
        page_floor=base + pages,
        trim_seconds=result.seconds,
        trim_method=result.method,
        pools_released=result.pools_released,
        build_seconds=build,
    )


def emit(**values: Any) -> None:
    """Print the case's RESULT line, with the allocator that served it."""
    values.setdefault("allocator", memreclaim.allocator())
    values.setdefault("allocator_version", memreclaim.allocator_version())
    values.setdefault("python", platform.python_version())
    print("RESULT " + json.dumps(values), flush=True)
