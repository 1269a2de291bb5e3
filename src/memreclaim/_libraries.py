"""Allocators inside libraries: the pools memreclaim can release, and those it can only name.

Some libraries bring an allocator of their own, whose memory ``malloc_trim`` and its kin never
reach. Each one memreclaim knows is described here, once, and found through ``sys.modules``:
memreclaim never imports a library itself, and a library that is not imported costs nothing.

- **pyarrow**: its default memory pool (a bundled mimalloc or jemalloc; ``system`` is malloc's
  own, which the process allocator's trim covers). Released with ``release_unused()`` after one
  small allocation from the calling thread: mimalloc's collect starts from the calling thread's
  heap, and a thread that never allocated through the pool (a runner's trim thread) has none,
  so its collect gave back nothing (issue 22: 0 from a new thread, 143 MB from the worker).
- **polars**: a bundled jemalloc (tikv-jemallocator, ``_rjem_`` prefix, symbols not exported):
  nothing memreclaim can call. polars 2.1 purges freed pages itself on jemalloc's background
  threads (measured: 95 MiB over baseline after a 500,000-row join, back to baseline within
  2 s; with ``background_thread:false`` they stay). Its own setting, read once at start, is the
  environment variable ``_RJEM_MALLOC_CONF``.
- **duckdb**: a bundled jemalloc (``duckdb_je_`` prefix) that duckdb drives itself; its own
  settings are ``allocator_flush_threshold`` and ``allocator_background_threads``.

:func:`releasers` is what :func:`memreclaim.trim` passes to the C core; :func:`figures` is what
:func:`memreclaim.stats` reports as ``MemoryStats.libraries``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

Releaser = tuple[str, "Callable[[], None]"]


def _arrow_pool() -> tuple[Any, Any] | None:
    """(pyarrow, its default pool) when pyarrow is imported, else None."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None:
        return None
    return pyarrow, pyarrow.default_memory_pool()


def _release_arrow() -> None:
    found = _arrow_pool()
    if found is None:  # imported when trim() listed it; gone since (a test's monkeypatch)
        return
    pyarrow, pool = found
    # One allocation gives this thread a heap in the pool's mimalloc, which its collect needs
    # (jemalloc's purge reaches every arena from any thread: the allocation costs it nothing).
    pyarrow.allocate_buffer(64, memory_pool=pool)
    pool.release_unused()


def releasers() -> tuple[Releaser, ...]:
    """(name, release) for each imported library whose own allocator memreclaim can release."""
    found = _arrow_pool()
    if found is None or found[1].backend_name == "system":
        return ()
    return (("pyarrow", _release_arrow),)


def in_use() -> int:
    """Bytes the releasable library pools report in use (0 when none is imported): cheap, for
    a runner's tick (pyarrow: ``bytes_allocated()``)."""
    found = _arrow_pool()
    if found is None or found[1].backend_name == "system":
        return 0
    return int(found[1].bytes_allocated())


_UNREACHABLE: dict[str, dict[str, Any]] = {
    "polars": {
        "modules": ("_polars_runtime_32", "_polars_runtime_64", "_polars_runtime_compat"),
        "allocator": "jemalloc",
        "releasable": False,
        "in_use": None,
        "setting": "_RJEM_MALLOC_CONF",
        "note": "polars' bundled jemalloc exports no call memreclaim can make; it purges "
        "freed pages by itself on its background threads (polars 2.1: within ~2 s of a "
        "join); where a build keeps them, start with _RJEM_MALLOC_CONF="
        "background_thread:true,dirty_decay_ms:1000",
    },
    "duckdb": {
        "modules": ("_duckdb", "duckdb"),
        "allocator": "jemalloc",
        "releasable": False,
        "in_use": None,
        "setting": "allocator_flush_threshold, allocator_background_threads",
        "note": "duckdb's bundled jemalloc is flushed by duckdb itself after a task that "
        "allocated more than allocator_flush_threshold; SET allocator_background_threads=true "
        "makes it return freed pages while idle",
    },
}


def figures() -> dict[str, dict[str, Any]]:
    """The allocators of the imported libraries, by library name.

    Each entry says which allocator (``allocator``), whether :func:`memreclaim.trim` releases
    it (``releasable``), how many bytes it reports in use (``in_use``, None when the library
    does not say), the library's own setting that does work (``setting``) and a ``note``.
    pyarrow's entry keeps its pool's figures under their own names too (``backend``,
    ``bytes_allocated``, ``max_memory``).
    """
    result: dict[str, dict[str, Any]] = {}
    found = _arrow_pool()
    if found is not None:
        pool = found[1]
        backend = pool.backend_name
        allocated = pool.bytes_allocated()
        result["pyarrow"] = {
            "allocator": backend,
            "releasable": True,
            "in_use": allocated,
            "setting": "ARROW_DEFAULT_MEMORY_POOL",
            "note": "malloc's own memory: the process allocator's trim covers it"
            if backend == "system"
            else "released by trim(): default_memory_pool().release_unused()",
            "backend": backend,
            "bytes_allocated": allocated,
            "max_memory": pool.max_memory(),
        }
    for name, known in _UNREACHABLE.items():
        if any(module in sys.modules for module in known["modules"]):
            result[name] = {key: value for key, value in known.items() if key != "modules"}
    return result
