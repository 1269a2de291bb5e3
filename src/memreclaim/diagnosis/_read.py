"""Reading the process for the diagnosis: one :class:`Point` per reading.

Every figure comes from the C core (:mod:`memreclaim._core`): the allocator's in-use bytes per
part, what it owns, anonymous/shared/file RSS, pymalloc's arenas, threads, glibc's tcache,
the resident bytes of mimalloc's mappings. Nothing here judges.
"""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc
from dataclasses import dataclass
from typing import Any

from .. import _core
from .._core import UnsupportedAllocatorError, heap_stats, stats
from . import _mimalloc


@dataclass
class Point:
    """Every component after one iteration (bytes; ``threads`` a count; None: unreadable)."""

    traced: int | None
    own: int
    parts: dict[str, int] | None
    owned: int | None
    anon: int | None
    shmem: int | None
    pymalloc: tuple[int, int] | None
    threads: int
    file: int | None = None  # RssFile: file-backed resident bytes (mapped files)
    tcache: int | None = None  # glibc: bytes in this thread's tcache (counted in "heap")
    mimalloc: Any = None  # mimalloc: what Mimalloc.read kept, to recompute parts at the end
    #: mimalloc: resident bytes of its mappings (every thread's heap), recomputed at the end
    mapped: int | None = None


def glibc_tcache() -> int | None:
    """Bytes in the calling thread's glibc tcache, or None when they cannot be read."""
    return _core.diag_glibc_tcache()


def heap(name: str) -> tuple[dict[str, int] | None, int | None, str | None]:
    """(in-use bytes per part, bytes the allocator owns in RSS or mapped, why unavailable)."""
    if name == "mimalloc":
        try:
            parts, committed = _mimalloc.instance().read()
        except (AttributeError, OSError) as exc:
            return None, None, f"mimalloc's heap cannot be visited ({exc})"
        return parts, committed, None
    if name == "jemalloc":
        _core.diag_jemalloc_flush()  # cached blocks count as allocated: flushed first
    try:
        figures = heap_stats().figures  # jemalloc: a new epoch, after the flush
    except UnsupportedAllocatorError as exc:
        return None, None, f"the {name} allocator reports no in-use bytes ({exc})"
    if name == "glibc":
        parts = {"heap": figures["uordblks"], "mmapped": figures["hblkhd"]}
        return parts, figures["arena"] + figures["hblkhd"], None
    if name == "jemalloc":
        split = _core.diag_jemalloc_parts()
        found = {"small": split[0], "large": split[1]} if split is not None else None
        return found or {"allocated": figures["allocated"]}, figures["resident"], None
    if name == "tcmalloc":
        owned = figures["heap_size"] - figures.get("pageheap_unmapped_bytes", 0)
        return {"allocated": figures["current_allocated_bytes"]}, owned, None
    return None, None, f"no in-use figure is known for the {name} allocator"


def pymalloc() -> tuple[int, int] | None:
    """(bytes in pymalloc arenas, bytes in allocated pymalloc blocks), or None without pymalloc
    (``PYTHONMALLOC=malloc``, another allocator hook). Walks the arenas in C: well under a
    millisecond for hundreds of MiB."""
    try:
        return _core.diag_pymalloc(tracemalloc.is_tracing())
    except OSError:
        return None


def threads() -> int:
    """Threads of this process (/proc/self/status)."""
    try:
        count = _core.process_status(os.getpid()).threads
    except OSError:
        count = None
    return count if isinstance(count, int) else threading.active_count()


def point(alloc: str, traced: bool, tcache: bool = False) -> Point:
    """Read every component (after ``gc.collect()``). ``tcache``: also read glibc's tcache
    (tenths of a second on a fragmented heap: at the baseline and a single shot's end only;
    over repeated iterations its one-time fill is not steady growth)."""
    gc.collect()
    held = glibc_tcache() if tcache and alloc == "glibc" else None
    parts, owned, _ = heap(alloc)
    st = stats()
    mi = _mimalloc.current() if alloc == "mimalloc" else None
    return Point(
        traced=tracemalloc.get_traced_memory()[0] if traced else None,
        own=tracemalloc.get_tracemalloc_memory() if traced else 0,
        parts=parts,
        owned=owned,
        anon=st.rss_anon,
        shmem=st.rss_shmem,
        pymalloc=pymalloc(),
        threads=threads(),
        file=st.rss_file,
        tcache=held,
        mimalloc=mi.last if mi is not None else None,
        mapped=mi.resident(mi.last[0]) if mi is not None and mi.last[0] else None,
    )


def diff(b: Point, a: Point) -> Point:
    """Each component's absolute difference between two readings (the jitter)."""

    def d(x: int | None, y: int | None) -> int | None:
        return None if x is None or y is None else abs(x - y)

    parts = None
    if a.parts is not None and b.parts is not None:
        parts = {k: abs(b.parts[k] - a.parts.get(k, 0)) for k in b.parts}
    return Point(
        traced=d(b.traced, a.traced),
        own=abs(b.own - a.own),
        parts=parts,
        owned=d(b.owned, a.owned),
        anon=d(b.anon, a.anon),
        shmem=d(b.shmem, a.shmem),
        pymalloc=None,
        threads=abs(b.threads - a.threads),
        file=d(b.file, a.file),
        tcache=d(b.tcache, a.tcache),
        mapped=d(b.mapped, a.mapped),
    )


def in_use(alloc: str) -> int | None:
    """The allocator's in-use bytes (every part), or None when unreadable."""
    parts = heap(alloc)[0]
    return None if parts is None else sum(parts.values())
