"""memreclaim: give freed memory back to the operating system, and tell retention from leaks.

The core is a C extension (``memreclaim._core``); everything here is re-exported from it or
built on it. All sizes are in bytes.

    >>> import memreclaim
    >>> result = memreclaim.trim()          # malloc_trim(0) / jemalloc purge / mi_collect ...
    >>> result.released, result.allocator   # bytes given back, measured from RSS
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ._core import (
    MMAP_THRESHOLD_MAX,
    HeapStats,
    MemoryStats,
    TrimResult,
    UnsupportedAllocatorError,
    allocator,
    allocator_version,
    heap_stats,
    malloc_info,
    pin_mmap_threshold,
    rss,
    set_trim_threshold,
    stats,
    trim,
)
from ._version import __version__
from .glibc import ArenaInfo, arenas, set_arena_max
from .units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from .watchdog import BackgroundTrimmer, Counters, PacingPolicy, TrimEvent, Watchdog

# The policy layer (memreclaim.watchdog) is imported on first use, not with the api layer.
_POLICY_EXPORTS = frozenset(
    {"BackgroundTrimmer", "Counters", "PacingPolicy", "TrimEvent", "Watchdog"}
)


def __getattr__(name: str) -> Any:
    if name in _POLICY_EXPORTS:
        from . import watchdog

        return getattr(watchdog, name)
    raise AttributeError(f"module 'memreclaim' has no attribute {name!r}")


__all__ = [
    "MMAP_THRESHOLD_MAX",
    "ArenaInfo",
    "BackgroundTrimmer",
    "Counters",
    "HeapStats",
    "MemoryStats",
    "PacingPolicy",
    "TrimEvent",
    "TrimResult",
    "UnsupportedAllocatorError",
    "Watchdog",
    "__version__",
    "allocator",
    "allocator_version",
    "arenas",
    "format_bytes",
    "heap_stats",
    "malloc_info",
    "parse_bytes",
    "pin_mmap_threshold",
    "rss",
    "set_arena_max",
    "set_trim_threshold",
    "stats",
    "trim",
    "trim_async",
]


async def trim_async(*, pools: bool = False) -> TrimResult:
    """Run :func:`trim` in a worker thread, so the event loop keeps running meanwhile.

    Off-loop is necessary but not sufficient: while glibc trims an arena it holds that arena's
    lock, and a loop thread that mallocs more than ~1 KiB meanwhile waits for it (holding the
    GIL). :class:`memreclaim.watchdog.Watchdog` paces trims to the loop's idle time.

    The trim runs in the loop's default executor; if the task awaiting it is cancelled, the
    trim itself still completes in that thread (it cannot be interrupted).
    """
    return await asyncio.to_thread(trim, pools=pools)
