"""memreclaim: give freed memory back to the operating system, and tell retention from leaks.

The core is a C extension (``memreclaim._core``); everything here is re-exported from it or
built on it. All sizes are in bytes.

    >>> import memreclaim
    >>> result = memreclaim.trim()          # malloc_trim(0) / jemalloc purge / mi_collect ...
    >>> result.released, result.allocator   # bytes given back, measured from RSS

The policy layer (the watchdogs in :mod:`memreclaim.watchdog`, the diagnosis engine in
:mod:`memreclaim.diagnosis`) is re-exported here too, but imported on first use, so that
``import memreclaim`` stays as light as the api layer.
"""

from __future__ import annotations

from . import _core, _libraries
from ._core import (
    HeapStats,
    MemoryStats,
    TrimResult,
    UnsupportedAllocatorError,
    allocator,
    allocator_version,
    collect_thread,
    heap_stats,
    pin_mmap_threshold,
    rss,
    set_purge_delay,
    set_thp_marking,
    set_trim_threshold,
    thp_settings,
    totals,
)
from ._version import __version__

# `typing` alone costs ~2 MiB of RSS: not imported at run time (mypy knows this constant).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._process import inspect
    from .diagnosis import AllocationSite, Report, Snapshot, ameasure, diagnose, measure, snapshot
    from .memlimits import limits
    from .policy import PacingPolicy
    from .pools import (
        PoolReclaimStatus,
        PoolReclaimUnavailable,
        enable_pool_reclaim,
        estimate_pool_reclaim,
        pool_reclaim_status,
    )
    from .remote import install_signal_handler
    from .runners import BackgroundTrimmer, Counters, TrimEvent, Watchdog

# Policy-layer names and the module each comes from, imported on first use: `import memreclaim`
# plus trim()/stats()/rss() cost under 1 MiB of RSS (tests/test_import_cost.py).
_LAZY_EXPORTS = {
    **dict.fromkeys(
        (
            "PoolReclaimStatus",
            "PoolReclaimUnavailable",
            "enable_pool_reclaim",
            "estimate_pool_reclaim",
            "pool_reclaim_status",
        ),
        "pools",
    ),
    **dict.fromkeys(
        ("AllocationSite", "Report", "Snapshot", "ameasure", "diagnose", "measure", "snapshot"),
        "diagnosis",
    ),
    **dict.fromkeys(("BackgroundTrimmer", "Counters", "TrimEvent", "Watchdog"), "runners"),
    "PacingPolicy": "policy",
    "limits": "memlimits",
    "inspect": "_process",
    "install_signal_handler": "remote",
}


_LAZY_SUBMODULES = frozenset(("_pools", "glibc", "pools", "units"))

# In 0.2.0 here, now in their own module (one release, then gone): name -> module.
_MOVED = {
    **dict.fromkeys(
        ("MMAP_THRESHOLD_MAX", "ArenaInfo", "arenas", "malloc_info", "set_arena_max"), "glibc"
    ),
    **dict.fromkeys(("format_bytes", "parse_bytes"), "units"),
    "Limits": "memlimits",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY_SUBMODULES:  # were attributes when imported eagerly (PyCapsule_Import too)
        return importlib.import_module(f".{name}", __name__)
    module = _LAZY_EXPORTS.get(name)
    if module is None and name in _MOVED:
        from . import _deprecated

        home = f"memreclaim.{_MOVED[name]}"
        value = getattr(importlib.import_module(home), name)
        return _deprecated.lookup(__name__, name, {name: (f"{home}.{name}", value)})
    if module is None:
        raise AttributeError(f"module 'memreclaim' has no attribute {name!r}")

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))


__all__ = [
    "AllocationSite",
    "BackgroundTrimmer",
    "Counters",
    "HeapStats",
    "MemoryStats",
    "PacingPolicy",
    "PoolReclaimStatus",
    "PoolReclaimUnavailable",
    "Report",
    "Snapshot",
    "TrimEvent",
    "TrimResult",
    "UnsupportedAllocatorError",
    "Watchdog",
    "__version__",
    "allocator",
    "allocator_version",
    "ameasure",
    "asdict",
    "collect_thread",
    "diagnose",
    "enable_pool_reclaim",
    "estimate_pool_reclaim",
    "heap_stats",
    "inspect",
    "install_signal_handler",
    "limits",
    "measure",
    "pin_mmap_threshold",
    "pool_reclaim_status",
    "rss",
    "set_purge_delay",
    "set_thp_marking",
    "set_trim_threshold",
    "snapshot",
    "stats",
    "thp_settings",
    "totals",
    "trim",
    "trim_async",
]


def trim(*, pools: bool = False) -> TrimResult:
    """Give the memory the allocator holds free back to the operating system.

    Calls the detected allocator's purge (glibc ``malloc_trim(0)``, jemalloc
    ``arena.<all>.purge``, ``mi_collect(true)``, tcmalloc ``ReleaseFreeMemory``) with the GIL
    released and returns a :class:`TrimResult`: ``released`` is the drop in anonymous resident
    bytes, measured from ``/proc/self/statm`` around the call, ``seconds`` the time the call
    took. With ``pools=True`` the pages of empty pymalloc pools are given back first (see
    :func:`enable_pool_reclaim`).

    Every call is counted once in the process-wide :func:`totals` that the metrics report (the
    C core counts each trim it makes, whoever calls it). When
    memreclaim cannot act on the allocator serving malloc, ``method`` is ``'none'``,
    ``reason`` says why, and the first such call in the process warns (``RuntimeWarning``).
    When a library with an allocator of its own is already imported (pyarrow's memory pool), it
    is asked to release too, from the calling thread, whichever thread that is; ``parts`` says
    what each allocator gave back. ``stats().libraries`` names the library allocators that
    memreclaim cannot release, and the setting that does work for each.

    Under mimalloc, ``mi_collect(true)`` runs with the purge delay at 0 for mimalloc 2's segment
    pass and at least 1 for the arena pass of 2.1+/3.x, and the calling thread's heap is
    initialised first (one never initialised collects nothing). Under mimalloc 2 the first call
    also leaves mimalloc's ``abandoned_page_decommit`` on: a thread that exits afterwards gives
    its free pages back as it exits. What it cannot reach there: memory freed under a delay by
    the main thread (see :func:`set_purge_delay`) or by another live thread (see
    :func:`collect_thread`).
    """
    result = _core.trim(pools=pools, libraries=_libraries.releasers())
    if result.reason is not None:
        _warn_cannot_act(result.reason)
    return result


def stats(*, heap: bool = False) -> MemoryStats:
    """RSS broken down, tracemalloc's totals, the allocator, and the libraries' allocators.

    ``rss``, ``rss_anon``, ``rss_file``, ``rss_shmem``, ``peak_rss`` and ``swap`` come from
    ``/proc/self/status``; ``traced_current``/``traced_peak`` from tracemalloc (None when it is
    not tracing); ``allocator``, ``via`` and ``reason`` say which allocator serves malloc and,
    if memreclaim cannot act on it, why. ``libraries`` describes the allocators inside
    already-imported libraries (pyarrow's pool, polars' and duckdb's bundled jemalloc): which
    ones :func:`trim` releases, what they report in use, and the setting that works for the
    others. ``heap=True`` adds the allocator's own figures (:func:`heap_stats`).

    Raises:
        TypeError: ``heap`` is not a bool.
        OSError: ``/proc/self/status`` cannot be read.
    """
    return _core.stats(heap=heap, libraries=_libraries.figures())


_warned_cannot_act = False


def _warn_cannot_act(reason: str) -> None:
    """One RuntimeWarning per process saying why trim() does nothing."""
    global _warned_cannot_act
    if not _warned_cannot_act:
        _warned_cannot_act = True
        import warnings

        warnings.warn(reason, RuntimeWarning, stacklevel=3)


async def trim_async(*, pools: bool = False) -> TrimResult:
    """Run :func:`trim` in a worker thread, so the event loop keeps running meanwhile.

    Off-loop is necessary but not sufficient: while glibc trims an arena it holds that arena's
    lock, and a loop thread that mallocs more than ~1 KiB meanwhile waits for it (holding the
    GIL). :class:`memreclaim.watchdog.Watchdog` paces trims to the loop's idle time.

    The trim runs in the loop's default executor; if the task awaiting it is cancelled, the
    trim itself still completes in that thread (it cannot be interrupted).
    """
    import asyncio  # not at import time: `import memreclaim` stays light

    return await asyncio.to_thread(trim, pools=pools)


def asdict(result: object) -> dict[str, Any]:
    """A result as a plain dict, for JSON: every field by name, in the result's field order.

    The one dict form of every result type: the C core's struct sequences (:class:`TrimResult`,
    :class:`MemoryStats`, :class:`HeapStats`, what :func:`collect_thread` returns, ...), the
    frozen dataclasses of the Python layers (what :func:`inspect` returns, :class:`Counters`,
    :class:`TrimEvent`, ...) and named tuples. Results nested in fields (``MemoryStats.heap``)
    become dicts the same way; mappings (``parts``, ``figures``, ``libraries``, read-only mapping
    proxies) become new dicts; tuples and lists become lists; other values are kept as they are. The
    command line's ``--json`` output and the answers of ``trim --pid`` / ``stats --pid`` are built
    with it, so their keys are the fields' names.

    Raises:
        TypeError: ``result`` is not a result (a class, a plain tuple, a dict, ...).
    """
    names = _field_names(result)
    if names is None:
        raise TypeError(
            "asdict() takes a result (a struct sequence, a dataclass instance or a named"
            f" tuple), not {type(result).__name__}"
        )
    return {name: _plain(getattr(result, name)) for name in names}


def _field_names(value: object) -> tuple[str, ...] | None:
    """The field names of a result, or None when ``value`` is not one."""
    cls = type(value)
    if isinstance(value, tuple):
        visible = getattr(cls, "__match_args__", None)
        if isinstance(getattr(cls, "n_sequence_fields", None), int) and isinstance(visible, tuple):
            reduced = value.__reduce__()  # a struct sequence: (type, (visible, hidden fields))
            hidden = reduced[1][1] if isinstance(reduced, tuple) else {}
            return (*visible, *hidden)
        fields = getattr(cls, "_fields", None)  # a named tuple
        return tuple(fields) if isinstance(fields, tuple) else None
    if hasattr(cls, "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses  # already imported: the result's class is a dataclass

        return tuple(field.name for field in dataclasses.fields(value))  # type: ignore[arg-type]
    return None


def _plain(value: object) -> object:
    if _field_names(value) is not None:
        return asdict(value)
    keys = getattr(value, "keys", None)
    if callable(keys) and not isinstance(value, type):  # a dict, a read-only mapping proxy ...
        return {key: _plain(value[key]) for key in keys()}  # type: ignore[index]
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value
