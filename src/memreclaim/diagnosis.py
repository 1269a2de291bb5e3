"""Diagnosis engine: did this code leak, or is the allocator just holding freed memory?

    >>> before = memreclaim.snapshot()      # gc, trim, start tracemalloc, read the baseline
    >>> work()
    >>> report = memreclaim.diagnose(before)
    >>> print(report.format())              # verdict (leaks first), components, evidence, sites

or, to judge growth per iteration so that one-time caches are not called leaks::

    >>> report = memreclaim.measure(work, repeat=5, warmup=1)

Every component that can grow is read after each iteration (after ``gc.collect()``) and judged
on its own -- nothing is netted against anything else:

* **python** -- bytes traced by tracemalloc (live Python allocations);
* **native (malloc)** -- the allocator's in-use bytes, per part where it has parts (glibc: heap
  ``uordblks`` and mmapped chunks ``hblkhd``; jemalloc ``stats.allocated``; tcmalloc
  ``current_allocated_bytes``; mimalloc: the calling thread's heap, summed page by page with
  ``mi_heap_visit_blocks``), minus the Python allocations that live there (traced bytes not in
  pymalloc's arenas) and tracemalloc's own bookkeeping;
* **outside malloc** -- anonymous RSS that neither the allocator (its resident or mapped bytes)
  nor pymalloc's arenas own: a library's own ``mmap`` regions; shared memory (``RssShmem``:
  ``mmap.mmap(-1, n)``, multiprocessing heaps); and mapped files (``RssFile``: files mapped per
  call and kept; pages of code or data mapped once are one-time growth);
* threads, as evidence.

A component leaks when its least-squares slope over the measured iterations (the first one
excluded when there are two or more: it may fill a cache) times the number of iterations is over
the threshold, and the growth has not come back down at the end (intermittent growth -- every
third call -- counts; a transient does not). The threshold of each component is the larger of
``noise_floor`` and 8 times that component's jitter, measured by reading it twice before the
first iteration. Growth that is not steady is reported as ``one_time`` (caches).

After the last iteration the engine trims (:func:`memreclaim.trim`) and splits what stayed
resident: **allocator retention** (given back by the trim, or held in glibc thread-arena tops that
``malloc_trim`` does not shrink), **pymalloc retention** (arenas kept by a few live small objects),
**unreclaimed retention** (heap pages pinned by live blocks, fragmentation). None of these is a
leak. Leaks are always named first in the verdict.

With an allocator memreclaim does not know, what can be judged is judged (Python growth, shared
memory, retention) and the native components are ``None`` with the reason in
:attr:`Report.native_reason`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import inspect
import itertools
import os
import re
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from . import _validate
from ._core import (
    TrimResult,
    UnsupportedAllocatorError,
    allocator,
    heap_stats,
    mimalloc_areas,
    stats,
)
from .pools import PoolReclaimUnavailable, estimate_pool_reclaim, pool_reclaim_status
from .units import format_bytes

__all__ = [
    "AllocationSite",
    "Report",
    "Snapshot",
    "ameasure",
    "diagnose",
    "measure",
    "snapshot",
]

DEFAULT_NOISE_FLOOR = 256 * 1024
DEFAULT_FRAMES = 8
_JITTER_FACTOR = 8  # a component's threshold is at least this many times its measured jitter
_MARGIN_GLIBC = 0.06  # uncertainty of the malloc-side cost of traced allocations
_MARGIN_OTHER = 0.25  # size classes of jemalloc/tcmalloc/mimalloc round more
_JEMALLOC_SMALL = 14 * 1024  # jemalloc's largest small size class (SC_SMALL_MAXCLASS)
_FOOTPRINT_FACTOR = 4  # resident footprints (mimalloc): threshold at least 4x the noise floor
_MIN_SITE = 1024  # allocation sites that gained less are not listed
_CALIBRATION_OBJECTS = 4000  # small: calibration must not raise the peak RSS (VmHWM)

_LABELS = {
    "python_leak": "Python leak",
    "native_leak": "native leak (malloc)",
    "mapped_leak": "native leak outside malloc",
    "allocator_retention": "allocator retention",
    "pymalloc_retention": "pymalloc retention",
    "unreclaimed_retention": "pinned by live blocks",
}
LEAK_KINDS = ("python_leak", "native_leak", "mapped_leak")
RETENTION_KINDS = ("allocator_retention", "pymalloc_retention", "unreclaimed_retention")


# ---- reading the process -------------------------------------------------------------------


def _malloc_and_free(lib: ctypes.CDLL) -> tuple[Any, Any]:
    """``malloc`` and ``free`` of ``lib`` as typed ctypes functions (probing the allocator)."""
    malloc, free = lib.malloc, lib.free
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free.restype = None
    free.argtypes = [ctypes.c_void_p]
    return malloc, free


class _Mimalloc:
    """mimalloc's figures.

    2.x: the in-use bytes of the calling thread's heap, summed page by page with
    ``mi_heap_visit_blocks`` and split into small (blocks up to 64 KiB) and large blocks, so that
    small frees do not net a large leak; the process-wide figures of 2.x move in 32 MiB steps.
    3.x: the visit no longer sees full pages (they leave the heap's queues), so the in-use bytes
    cannot be read, and its committed bytes run ahead of use; the resident bytes of its mappings
    (all threads, from /proc/self/smaps) stand in for them: a footprint, confirmed after the
    trim (``mi_collect``)."""

    _SMALL = 64 * 1024
    _MAX_AREAS = 1_000_000  # pages of 64 KiB and more: a 64 GiB heap

    def __init__(self) -> None:
        from ._core import allocator_version

        lib = ctypes.CDLL(None)
        version = allocator_version() or "0"
        self.major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
        # The page walk runs in C (_core.mimalloc_areas): a Python callback allocates (and may
        # free) while mimalloc follows its page queues; such a walk was once seen never ending.
        # 3.6 no longer exports mi_heap_get_backing: the walk is optional from 3.x on.
        self._walkable = True
        try:
            self._walk()
        except UnsupportedAllocatorError:
            if not self.footprint:
                raise AttributeError(
                    "mi_heap_get_backing/mi_heap_visit_blocks are not exported"
                ) from None
            self._walkable = False

        self._malloc, self._free = _malloc_and_free(lib)
        self._collect = lib.mi_collect
        self._collect.restype = None
        self._collect.argtypes = [ctypes.c_bool]
        self._probes: set[int] = set()  # addresses known to lie in mimalloc's mappings
        self.last: tuple[tuple[tuple[int, int, int], ...], int, tuple[int, int] | None] = (
            (),
            0,
            None,
        )

    @property
    def footprint(self) -> bool:
        """Whether the figure is resident bytes (3.x) rather than bytes in use."""
        return self.major >= 3

    def _maps(self) -> tuple[tuple[int, int, int], ...]:
        """(start, end, resident bytes) of each anonymous mapping, after probing: a few blocks
        are malloc'd and freed, and this thread's pages visited, to learn which mappings hold
        mimalloc's memory (:meth:`resident` decides with every address learnt so far, so a
        mapping found late also counts at the points read before)."""
        for size in (64, 16 * 1024, 1 << 20):
            block = self._malloc(size)
            if block:
                self._probes.add(block)
                self._free(block)
        if self._walkable and len(self._probes) < 4096:
            self._probes.update(self._walk()["addresses"])
        maps: list[tuple[int, int, int]] = []
        anonymous = False
        with open("/proc/self/smaps", "rb") as smaps:
            for line in smaps:
                head = line.split(b" ", 1)[0]
                if b"-" in head and not head.endswith(b":"):
                    anonymous = len(line.split()) < 6
                    if anonymous:
                        low, high = (int(x, 16) for x in head.split(b"-"))
                        maps.append((low, high, 0))
                elif anonymous and line.startswith(b"Rss:"):
                    low, high, _ = maps[-1]
                    maps[-1] = (low, high, int(line.split()[1]) * 1024)
        return tuple(maps)

    def resident(self, maps: tuple[tuple[int, int, int], ...]) -> int:
        """Resident bytes of mimalloc's mappings among ``maps``: those that hold a known
        address, and the anonymous mappings contiguous with them (one reservation, split by
        its commits)."""
        total = 0
        run: list[tuple[int, int, int]] = []

        def close() -> int:
            hit = any(low <= a < high for low, high, _ in run for a in self._probes)
            return sum(rss for _, _, rss in run) if hit else 0

        for entry in sorted(maps):
            if run and run[-1][1] != entry[0]:
                total += close()
                run = []
            run.append(entry)
        return total + (close() if run else 0)

    def _walk(self) -> dict[str, Any]:
        """This thread's heap, page by page; OSError (EOVERFLOW) past ``_MAX_AREAS`` pages."""
        return mimalloc_areas(self._SMALL, self._MAX_AREAS)

    def read(self) -> tuple[dict[str, int], int]:
        """(in-use bytes per part, owned bytes); :attr:`last` keeps what :meth:`parts` needs to
        recompute them once every mapping is known."""
        if self.footprint:
            self._collect(True)  # freed pages are purged now, not after a delay
        maps = self._maps()
        committed = 0
        small_large = None
        if not self.footprint and self._walkable:
            walk = self._walk()
            committed = walk["committed"]
            small_large = (walk["small"], walk["large"])
        self.last = (maps, committed, small_large)
        return self.parts(self.last)

    def parts(
        self, raw: tuple[tuple[tuple[int, int, int], ...], int, tuple[int, int] | None]
    ) -> tuple[dict[str, int], int]:
        """(parts, owned bytes) from what :meth:`read` kept, with every address known now."""
        maps, committed, small_large = raw
        if small_large is None:
            resident = self.resident(maps)
            return {"resident": resident}, resident
        # 2.x: other threads' heaps cannot be visited, and the resident memory of its mappings
        # does not tell them from this thread's freed segments (2.x keeps them after a
        # collect): memory another thread mallocs shows as memory outside malloc.
        return {"small": small_large[0], "large": small_large[1]}, committed


_mimalloc: _Mimalloc | None = None


class _Jemalloc:
    """jemalloc's in-use bytes split into small (slab) and large (extent) allocations, read after
    flushing the calling thread's cache (jemalloc counts cached blocks as allocated: without the
    flush the figure moves by whatever the cache happens to hold)."""

    _ALL = 4096  # MALLCTL_ARENAS_ALL

    def __init__(self) -> None:
        self._ctl = ctypes.CDLL(None).mallctl  # AttributeError when absent
        self._ctl.restype = ctypes.c_int
        self._ctl.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_void_p,
            ctypes.c_size_t,
        ]

    def flush(self) -> None:
        self._ctl(b"thread.tcache.flush", None, None, None, 0)  # fails only without a tcache

    def parts(self) -> dict[str, int] | None:
        """{"small": ..., "large": ...} from the statistics of the current epoch."""
        out = {}
        for part in ("small", "large"):
            value = ctypes.c_size_t()
            size = ctypes.c_size_t(ctypes.sizeof(value))
            name = f"stats.arenas.{self._ALL}.{part}.allocated".encode()
            if self._ctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
                return None
            out[part] = value.value
        return out


class _Mallinfo2(ctypes.Structure):
    _NAMES = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
    _fields_ = [(name, ctypes.c_size_t) for name in (*_NAMES, "uordblks", "fordblks", "keepcost")]


class _GlibcTcache:
    """Bytes held by the calling thread's tcache. glibc counts them as in use (``uordblks``):
    since 2.42 a thread's tcache holds up to 16 freed chunks of each size up to 1 KiB (~0.5 MiB,
    was 7: ~0.2 MiB), enough to pass for a native leak of a single shot.

    Read by taking the chunks out of each tcache bin (``malloc``) until one comes from the arena
    (``uordblks`` moves), then freeing them all: the tcache ends as full as it was, plus what
    the probe itself put back (counted in the result)."""

    _BINS = 64  # tcache bins of chunks of 32..1040 bytes (glibc's default tcache_max)
    _MAX_PER_BIN = 1024  # glibc.malloc.tcache_count is at most 65535; 16 by default

    def __init__(self) -> None:
        lib = ctypes.CDLL(None)
        self._info = lib.mallinfo2  # AttributeError before glibc 2.33
        self._info.restype = _Mallinfo2
        self._info.argtypes = []
        self._malloc, self._free = _malloc_and_free(lib)

    def read(self) -> int:
        start = self._info().uordblks
        held = 0
        taken = (ctypes.c_void_p * (self._MAX_PER_BIN + 1))()
        for index in range(self._BINS):
            chunk = 32 + 16 * index
            used = self._info().uordblks
            count = 0
            while count <= self._MAX_PER_BIN:
                taken[count] = self._malloc(chunk - 8)
                count += 1
                if not taken[count - 1] or self._info().uordblks != used:
                    break
                held += chunk
            for i in range(count - 1, -1, -1):
                if taken[i]:
                    self._free(taken[i])
        return int(held + self._info().uordblks - start)


_jemalloc: _Jemalloc | None = None
_tcache: _GlibcTcache | None = None


def _glibc_tcache() -> int | None:
    """Bytes in the calling thread's glibc tcache, or None when they cannot be read."""
    global _tcache
    try:
        if _tcache is None:
            _tcache = _GlibcTcache()
        return _tcache.read()
    except (AttributeError, OSError):
        return None


def _heap(name: str) -> tuple[dict[str, int] | None, int | None, str | None]:
    """(in-use bytes per part, bytes the allocator owns in RSS or mapped, why unavailable)."""
    global _mimalloc
    if name == "mimalloc":
        try:
            if _mimalloc is None:
                _mimalloc = _Mimalloc()
            parts, committed = _mimalloc.read()
        except (AttributeError, OSError) as exc:
            return None, None, f"mimalloc's heap cannot be visited ({exc})"
        return parts, committed, None
    global _jemalloc
    jemalloc = None
    if name == "jemalloc":
        try:
            if _jemalloc is None:
                _jemalloc = _Jemalloc()
            jemalloc = _jemalloc
            jemalloc.flush()
        except (AttributeError, OSError):
            jemalloc = None
    try:
        figures = heap_stats().figures  # jemalloc: a new epoch, after the flush
    except UnsupportedAllocatorError as exc:
        return None, None, f"the {name} allocator reports no in-use bytes ({exc})"
    if name == "glibc":
        parts = {"heap": figures["uordblks"], "mmapped": figures["hblkhd"]}
        return parts, figures["arena"] + figures["hblkhd"], None
    if name == "jemalloc":
        split = jemalloc.parts() if jemalloc is not None else None
        return split or {"allocated": figures["allocated"]}, figures["resident"], None
    if name == "tcmalloc":
        owned = figures["heap_size"] - figures.get("pageheap_unmapped_bytes", 0)
        return {"allocated": figures["current_allocated_bytes"]}, owned, None
    return None, None, f"no in-use figure is known for the {name} allocator"


_PYMALLOC_FIELDS = {
    "arenas": re.compile(r"^(\d+) arenas \* (\d+) bytes/arena", re.M),
    "allocated": re.compile(r"^# bytes in allocated blocks\s*=\s*([\d,]+)", re.M),
}


class _Allocator(ctypes.Structure):
    """CPython's ``PyMemAllocatorEx``."""

    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("malloc", ctypes.c_void_p),
        ("calloc", ctypes.c_void_p),
        ("realloc", ctypes.c_void_p),
        ("free", ctypes.c_void_p),
    ]


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


_OBJ_DOMAIN = 2  # PYMEM_DOMAIN_OBJ


def _object_of(libc: Any, address: int) -> int | None:
    info = _DlInfo()
    if not libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
        return None
    return info.dli_fbase or None


@functools.cache
def _dump_functions() -> tuple[Any, Any, Any]:
    """(libc, the C API, ``_PyObject_DebugMallocStats``), typed once: binding them allocates
    Python objects, which would otherwise show among the workload's allocation sites."""
    libc = ctypes.CDLL(None)
    api = ctypes.pythonapi
    dump = api._PyObject_DebugMallocStats
    dump.argtypes = [ctypes.c_void_p]
    dump.restype = ctypes.c_int
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    api.PyMem_GetAllocator.argtypes = [ctypes.c_int, ctypes.POINTER(_Allocator)]
    api.PyMem_GetAllocator.restype = None
    api.PyMem_SetAllocator.argtypes = [ctypes.c_int, ctypes.POINTER(_Allocator)]
    api.PyMem_SetAllocator.restype = None
    return libc, api, dump


def _pymalloc_dump() -> str | None:
    """CPython's ``_PyObject_DebugMallocStats`` written to an in-memory stream.

    It answers only while pymalloc is the object allocator; while tracemalloc hooks it, the hook
    keeps the allocator it wraps in its context: that one is put back for the call (the GIL is
    held throughout, and the dump allocates no Python object), after checking that it lies in
    the same object as ``PyMem_Malloc`` (another hook than tracemalloc's: no figures)."""
    libc, api, dump = _dump_functions()
    hooked = _Allocator()
    original: _Allocator | None = None
    if tracemalloc.is_tracing():
        api.PyMem_GetAllocator(_OBJ_DOMAIN, ctypes.byref(hooked))
        if not hooked.ctx:
            return None
        wrapped = _Allocator.from_address(hooked.ctx)
        home = _object_of(libc, ctypes.cast(api.PyMem_Malloc, ctypes.c_void_p).value or 0)
        if wrapped.ctx or not wrapped.malloc or _object_of(libc, wrapped.malloc) != home:
            return None
        original = _Allocator(None, wrapped.malloc, wrapped.calloc, wrapped.realloc, wrapped.free)
    buf = ctypes.c_char_p()
    size = ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return None
    try:
        if original is not None:
            api.PyMem_SetAllocator(_OBJ_DOMAIN, ctypes.byref(original))
        try:
            active = dump(stream)
        finally:
            if original is not None:
                api.PyMem_SetAllocator(_OBJ_DOMAIN, ctypes.byref(hooked))
    finally:
        libc.fclose(stream)
        text = ctypes.string_at(buf, size.value).decode("ascii", "replace") if buf else ""
        libc.free(ctypes.cast(buf, ctypes.c_void_p))
    return text if active else None


def _pymalloc() -> tuple[int, int] | None:
    """(bytes in pymalloc arenas, bytes in allocated pymalloc blocks), or None without pymalloc
    (``PYTHONMALLOC=malloc``, another allocator hook). Walks the arenas: well under a
    millisecond for hundreds of MiB."""
    try:
        text = _pymalloc_dump()
    except (AttributeError, OSError, ValueError):
        return None
    if text is None:
        return None
    arenas = _PYMALLOC_FIELDS["arenas"].search(text)
    allocated = _PYMALLOC_FIELDS["allocated"].search(text)
    if arenas is None or allocated is None:
        return None
    return int(arenas.group(1)) * int(arenas.group(2)), int(allocated.group(1).replace(",", ""))


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


@dataclass
class _Point:
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
    mimalloc: Any = None  # mimalloc: what _Mimalloc.read kept, to recompute parts at the end


def _point(alloc: str, traced: bool, tcache: bool = False) -> _Point:
    """Read every component (after ``gc.collect()``). ``tcache``: also read glibc's tcache
    (tenths of a second on a fragmented heap: at the baseline and a single shot's end only;
    over repeated iterations its one-time fill is not steady growth)."""
    gc.collect()
    held = _glibc_tcache() if tcache and alloc == "glibc" else None
    parts, owned, _ = _heap(alloc)
    st = stats()
    return _Point(
        traced=tracemalloc.get_traced_memory()[0] if traced else None,
        own=tracemalloc.get_tracemalloc_memory() if traced else 0,
        parts=parts,
        owned=owned,
        anon=st.rss_anon,
        shmem=st.rss_shmem,
        pymalloc=_pymalloc(),
        threads=_threads(),
        file=st.rss_file,
        tcache=held,
        mimalloc=_mimalloc.last if alloc == "mimalloc" and _mimalloc is not None else None,
    )


# ---- tracemalloc's own costs ---------------------------------------------------------------


@dataclass(frozen=True)
class _Calibration:
    """tracemalloc's hidden costs, measured once per process (bytes)."""

    per_trace: float  # allocator bytes per live trace that get_tracemalloc_memory() omits
    counted_per_trace: float  # bytes per trace entry that get_tracemalloc_memory() counts


_calibration: _Calibration | None = None


def _in_use(alloc: str) -> int | None:
    parts = _heap(alloc)[0]
    return None if parts is None else sum(parts.values())


def _calibrate(alloc: str) -> _Calibration:
    """Measure tracemalloc's per-trace bookkeeping (tracing must be on).

    tracemalloc counts its hash-table entries, but not their malloc headers nor the separately
    allocated trace records; both scale with the number of live traces. ``object()``s are
    allocated; under ``PYTHONMALLOC=malloc`` they are malloc's too, so the allocator's cost of
    as many raw 16-byte blocks (ctypes, untraced) is subtracted. A few thousand objects: the
    calibration does not move the peak RSS.
    """
    global _calibration
    if _calibration is not None:
        return _calibration
    count = _CALIBRATION_OBJECTS
    gc.collect()
    if _in_use(alloc) is None:
        _calibration = _Calibration(0.0, 16.0)
        return _calibration
    raw_cost = 0.0
    if _pymalloc() is None:  # objects go to malloc: learn what a 16-byte block costs there
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        blocks = (ctypes.c_void_p * count)()
        start = _in_use(alloc) or 0
        for i in range(count):
            blocks[i] = libc.malloc(16)
        raw_cost = ((_in_use(alloc) or 0) - start) / count
        for i in range(count):
            libc.free(blocks[i])
    holder: list[object] = [None] * count
    gc.collect()
    in_use0 = _in_use(alloc) or 0
    own0 = tracemalloc.get_tracemalloc_memory()
    steps: list[int] = []
    mark = own0
    for i in range(count):
        holder[i] = object()
        if i % 500 == 499:
            now = tracemalloc.get_tracemalloc_memory()
            steps.append(now - mark)
            mark = now
    in_use1 = _in_use(alloc) or 0
    own1 = tracemalloc.get_tracemalloc_memory()
    per_trace = (in_use1 - in_use0 - (own1 - own0)) / count - raw_cost
    counted = min(steps) / 500 if steps else (own1 - own0) / count  # a resize lands in one step
    del holder
    _calibration = _Calibration(
        per_trace=min(max(per_trace, 0.0), 256.0), counted_per_trace=min(max(counted, 1.0), 256.0)
    )
    return _calibration


class _OwnPeak:
    """Samples tracemalloc's own memory in a daemon thread to catch its peak (its freed tables
    land in the allocator's free lists and would otherwise pass for the workload's retention)."""

    def __init__(self, interval: float = 0.001) -> None:
        self.peak = tracemalloc.get_tracemalloc_memory()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memreclaim-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not tracemalloc.is_tracing():
                return
            self.peak = max(self.peak, tracemalloc.get_tracemalloc_memory())

    def cancel(self) -> None:
        self._stop.set()

    def stop(self) -> int:
        if tracemalloc.is_tracing():
            self.peak = max(self.peak, tracemalloc.get_tracemalloc_memory())
        self._stop.set()
        self._thread.join()
        return self.peak


# ---- the snapshot --------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Baseline for :func:`diagnose`, from :func:`snapshot`. Call :meth:`checkpoint` after each
    iteration of a repeated workload so the diagnosis can tell steady from one-time growth."""

    allocator: str
    traced: bool
    started_tracing: bool
    baseline: _Point
    jitter: _Point
    trim_released: int | None
    native_reason: str | None
    warmup: int = 0
    frames: int = DEFAULT_FRAMES
    checkpoints: list[_Point] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    untraced_seconds: float | None = None
    _tracemalloc: tracemalloc.Snapshot | None = field(default=None, repr=False)
    _ntraces: int = 0
    _sampler: _OwnPeak | None = field(default=None, repr=False)
    _used: bool = False
    _clock: float = field(default_factory=time.perf_counter, repr=False)

    def __del__(self) -> None:
        if self._sampler is not None:  # an abandoned snapshot must not leave its thread polling
            self._sampler.cancel()

    def close(self) -> None:
        """Stop the sampler thread, and tracemalloc if this snapshot started it (idempotent)."""
        if self._sampler is not None:
            self._sampler.stop()
        if self.started_tracing and not self._used and tracemalloc.is_tracing():
            tracemalloc.stop()
        self._used = True

    def checkpoint(self) -> None:
        """Record the end of one iteration (a ``gc.collect()`` and cheap counters)."""
        if self._used:
            raise RuntimeError("this snapshot was already diagnosed; take a new one")
        now = time.perf_counter()
        self.seconds.append(now - self._clock)
        self.checkpoints.append(_point(self.allocator, self.traced and tracemalloc.is_tracing()))
        self._clock = time.perf_counter()


def snapshot(
    *, trace: bool = True, frames: int = DEFAULT_FRAMES, trim_first: bool = True
) -> Snapshot:
    """Record the baseline that :func:`diagnose` compares against.

    Args:
        trace: start tracemalloc (with ``frames`` frames) if it is not running; :func:`diagnose`
            stops it again. Without tracing, Python and native growth cannot be told apart.
        frames: traceback depth for tracemalloc when this call starts it (>= 1): the depth of
            the allocation sites in the report. Deeper is slower.
        trim_first: trim the allocator first, so the trim at diagnosis returns only what the
            measured code left behind.

    If anything fails, tracemalloc is left as it was found.

    Raises:
        TypeError, ValueError: for a non-int or out-of-range ``frames``.
    """
    from . import trim

    _validate.integer("frames", frames, minimum=1, maximum=1000)
    _validate.flag("trace", trace)
    _validate.flag("trim_first", trim_first)
    started = False
    sampler: _OwnPeak | None = None
    try:
        alloc = allocator()
        if trace and not tracemalloc.is_tracing():
            tracemalloc.start(frames)
            started = True
        traced = tracemalloc.is_tracing()
        if traced:
            _calibrate(alloc)
        gc.collect()
        released = trim().released if trim_first else None
        sampler = _OwnPeak() if traced else None  # started first: its allocations predate base
        tm_snap = tracemalloc.take_snapshot() if traced else None
        base = _point(alloc, traced, tcache=True)
        again = _point(alloc, traced, tcache=True)  # read twice: each component's jitter
        reason = _heap(alloc)[2]
        return Snapshot(
            allocator=alloc,
            traced=traced,
            started_tracing=started,
            baseline=again,
            jitter=_diff_points(again, base),
            trim_released=released,
            native_reason=reason,
            frames=tracemalloc.get_traceback_limit() if traced else frames,
            _tracemalloc=tm_snap,
            _ntraces=len(tm_snap.traces) if tm_snap is not None else 0,
            _sampler=sampler,
        )
    except BaseException:
        if sampler is not None:
            sampler.stop()
        if started and tracemalloc.is_tracing():
            tracemalloc.stop()
        raise


def _diff_points(b: _Point, a: _Point) -> _Point:
    def d(x: int | None, y: int | None) -> int | None:
        return None if x is None or y is None else abs(x - y)

    parts = None
    if a.parts is not None and b.parts is not None:
        parts = {k: abs(b.parts[k] - a.parts.get(k, 0)) for k in b.parts}
    return _Point(
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
    )


# ---- the report ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocationSite:
    """A source line whose traced memory grew: ``filename:lineno``, bytes and blocks gained, and
    the call stack that led there (outermost first, up to the ``frames`` traced)."""

    filename: str
    lineno: int
    size: int
    count: int
    traceback: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{_short(self.filename)}:{self.lineno}: +{format_bytes(self.size)} in"
        text += f" {self.count:+d} blocks"
        if len(self.traceback) > 1:
            text += "\n      " + "\n      ".join(f"called from {t}" for t in self.traceback[-2::-1])
        return text


def _short(name: str) -> str:
    cwd = os.getcwd() + os.sep
    return name[len(cwd) :] if name.startswith(cwd) else name


@dataclass(frozen=True)
class Report:
    """The diagnosis: growth since a :class:`Snapshot`, split into components (bytes).

    Leaks (steady growth over the measured iterations): ``python_leak`` (None without
    tracemalloc), ``native_leak`` (malloc; None when the allocator's in-use bytes cannot be read:
    see ``native_reason``), ``mapped_leak`` (outside malloc: private mappings and shared memory;
    the private part is None with an unknown allocator). Not leaks: ``allocator_retention``,
    ``pymalloc_retention``, ``unreclaimed_retention``, ``one_time`` (caches). ``series`` holds each
    component after each iteration, relative to the baseline.
    """

    allocator: str
    iterations: int
    warmup: int
    noise_floor: int
    python_leak: int | None
    native_leak: int | None
    allocator_retention: int
    unreclaimed_retention: int
    noise: int
    one_time: int
    traced_growth: int | None
    in_use_growth: int | None
    anon_growth: int | None
    anon_growth_after_trim: int | None
    tracemalloc_overhead: int
    survivors: int | None
    top_sites: tuple[AllocationSite, ...]
    notes: tuple[str, ...]
    #: Bytes that ``trim(pools=True)`` could give back now from empty pymalloc pools, or None when
    #: pool reclaim is not enabled (see :func:`memreclaim.enable_pool_reclaim`).
    pool_reclaimable: int | None = None
    mapped_leak: int | None = 0
    shmem_leak: int = 0
    #: Part of ``mapped_leak``: file-backed resident bytes (files mapped and kept), steady growth.
    file_leak: int = 0
    pymalloc_retention: int = 0
    arena_tops: int = 0
    native_reason: str | None = None
    thread_growth: int = 0
    series: dict[str, tuple[int, ...]] = field(default_factory=dict)
    thresholds: dict[str, int] = field(default_factory=dict)
    slowdown: float | None = None
    frames: int = 1
    #: Why ``python_leak`` is None (tracemalloc off: ``trace=False``), else None.
    python_reason: str | None = None
    #: The trim the diagnosis made (what it called, what it gave back, how long it took).
    trim: TrimResult | None = None

    def components(self) -> dict[str, int]:
        """The measured components (missing ones as 0): leaks first, each group largest first,
        noise last."""
        leaks = {k: getattr(self, k) or 0 for k in LEAK_KINDS}
        kept = {k: getattr(self, k) for k in RETENTION_KINDS}
        ordered = dict(sorted(leaks.items(), key=lambda kv: -kv[1]))
        ordered.update(sorted(kept.items(), key=lambda kv: -kv[1]))
        ordered["noise"] = self.noise
        return ordered

    def significant(self) -> dict[str, int]:
        """What was found, at or above the noise floor: leaks first (largest first), then
        one-time growth (caches) and retention, largest first."""
        found = {
            k: v
            for k, v in self.components().items()
            if k != "noise" and v > 0 and v >= self.noise_floor
        }
        leaks = {k: v for k, v in found.items() if k in LEAK_KINDS}
        rest = {k: v for k, v in found.items() if k not in LEAK_KINDS}
        if self.one_time >= self.noise_floor:
            rest["one_time"] = self.one_time
        leaks.update(sorted(rest.items(), key=lambda kv: -kv[1]))
        return leaks

    def leaks(self) -> dict[str, int]:
        """The significant leak components (python, native, outside malloc), largest first."""
        return {k: v for k, v in self.significant().items() if k in LEAK_KINDS}

    @property
    def kind(self) -> str:
        """The first significant component (a leak whenever there is one; ``"one_time"`` for
        a cache filled once), or ``"clean"``."""
        sig = self.significant()
        return next(iter(sig)) if sig else "clean"

    @property
    def leak(self) -> int:
        """Steady leak (Python + native + outside malloc) over all measured iterations, bytes."""
        return sum(self.leaks().values())

    @property
    def leak_per_iteration(self) -> int:
        """:attr:`leak` divided by the number of measured iterations."""
        return self.leak // max(self.iterations, 1)

    @property
    def retained(self) -> int:
        """What stays resident after a trim: leaks plus pymalloc and unreclaimed retention."""
        return self.leak + self.pymalloc_retention + self.unreclaimed_retention

    @property
    def verdict(self) -> str:
        """One line naming what was found: leaks first, then what is held and why."""
        sig = self.significant()
        if not sig:
            text = f"clean: nothing grew above the noise floor ({format_bytes(self.noise_floor)})"
            if self.one_time >= self.noise_floor:
                text += f"; {format_bytes(self.one_time)} one-time growth (a cache, not a leak)"
            return text
        return "; ".join(self._phrase(name, value) for name, value in sig.items())

    def _phrase(self, name: str, value: int) -> str:
        if name == "one_time":
            return (
                f"one-time growth {format_bytes(value)} (grew once, not per iteration: a cache"
                " or a warm-up; not a leak)"
            )
        text = f"{_LABELS[name]} {format_bytes(value)}"
        extra = []
        if name in LEAK_KINDS and self.iterations > 1:
            extra.append(f"{format_bytes(value // self.iterations)} per iteration")
        if name == "native_leak" and self.traced_growth is not None:
            extra.append(f"tracemalloc saw {format_bytes(max(self.traced_growth, 0))}")
        if name == "mapped_leak":
            private = value - self.shmem_leak - self.file_leak
            if self.shmem_leak >= self.noise_floor:
                extra.append(f"shared memory {format_bytes(self.shmem_leak)}")
            if self.file_leak >= self.noise_floor:
                extra.append(f"mapped files {format_bytes(self.file_leak)}")
            if private >= self.noise_floor:
                extra.append(f"private mappings {format_bytes(private)}")
        if extra:
            text += f" ({', '.join(extra)})"
        if name == "allocator_retention":
            text += " (freed, held by the allocator"
            if self.arena_tops >= self.noise_floor and self.allocator == "glibc":
                text += f"; {format_bytes(self.arena_tops)} in glibc thread-arena tops"
            elif self.arena_tops >= self.noise_floor:
                text += f"; {format_bytes(self.arena_tops)} kept after its purge"
            text += "; not a leak)"
        elif name == "pymalloc_retention":
            text += f" ({self._pymalloc_text()})"
        elif name == "unreclaimed_retention":
            text += f" ({self._pinned_text()})"
        return text

    def _pymalloc_text(self) -> str:
        text = "pymalloc arenas kept by a few live small objects; not a leak"
        if self.pool_reclaimable:
            text += (
                f"; pool reclaim can return {format_bytes(self.pool_reclaimable)} of it"
                " (trim(pools=True))"
            )
        return text

    def _pinned_text(self) -> str:
        if self.native_leak is None:
            return (
                "not live in Python and not returned by trim: pinned pages, fragmentation, or "
                f"native memory {self.allocator} does not report; not a leak by the figures"
            )
        if self.leaks():
            return "heap pages around the leaked blocks, not returned by trim"
        return "heap pages that live blocks keep in use, not returned by trim; not a leak"

    def advice(self) -> list[str]:
        """What to do next, one line per significant component."""
        tips = {
            "python_leak": "Python objects stay referenced: see the top sites below for who "
            "allocated them (module-level lists/dicts, unbounded caches, closures).",
            "native_leak": "C code allocated without freeing; tracemalloc cannot see it. Run the "
            "workload under `memray run --native` or valgrind/heaptrack to find the caller.",
            "mapped_leak": "Mappings outside malloc stay (a library's own mmap allocator, "
            "shared memory, multiprocessing heaps, mapped files): compare /proc/self/maps "
            "before and after.",
            "allocator_retention": "Freed memory the allocator kept; memreclaim.trim() (or a "
            "watchdog) gives it back.",
            "pymalloc_retention": "A few long-lived small objects allocated during the spike "
            "keep whole pymalloc arenas: create long-lived objects before the spike, or copy "
            "them out.",
            "unreclaimed_retention": "Live blocks scattered over the heap keep its pages: "
            "allocate long-lived data before the spike.",
            "one_time": "Memory filled once and then kept (a cache, a pool, lazy imports): "
            "warmup=1 keeps it out of the measurement; bound it if it must not grow.",
        }
        if self.arena_tops >= self.noise_floor and self.allocator == "glibc":
            tips["allocator_retention"] += (
                " Thread-arena tops are given back by a trim made in the thread that owns the"
                " arena, or bounded with memreclaim.set_arena_max()."
            )
        if self.pool_reclaimable is None and self.pymalloc_retention:
            tips["pymalloc_retention"] += (
                " Where supported, memreclaim.enable_pool_reclaim() at start-up lets"
                " trim(pools=True) give back the empty pools of those arenas."
            )
        elif self.pool_reclaimable:
            tips["pymalloc_retention"] += (
                f" trim(pools=True) gives back {format_bytes(self.pool_reclaimable)} of it now."
            )
        return [tips[name] for name in self.significant()]

    def format(self) -> str:
        """A human-readable multi-line report: verdict, components, evidence, top sites."""
        run = f"{self.iterations} iteration{'s' if self.iterations != 1 else ''}"
        if self.warmup:
            run += f" after {self.warmup} warm-up"
        lines = [
            f"memreclaim diagnosis ({self.allocator}, {run})",
            f"verdict: {self.verdict}",
        ]
        width = max(len(label) for label in _LABELS.values())
        for name, value in self.components().items():
            label = _LABELS.get(name, "noise")
            raw = getattr(self, name)
            shown = "unavailable" if raw is None else format_bytes(value)
            lines.append(f"  {label:<{width}}  {shown:>11}")
        if self.one_time >= self.noise_floor:
            lines.append(
                f"  {'one-time growth':<{width}}  {format_bytes(self.one_time):>11}"
                "  (not repeated per iteration: caches, not counted as a leak)"
            )

        def fmt(value: int | None) -> str:
            return "n/a" if value is None else format_bytes(value)

        lines.append(
            f"raw: traced {fmt(self.traced_growth)}, allocator in-use {fmt(self.in_use_growth)},"
            f" anon RSS {fmt(self.anon_growth)} before trim, {fmt(self.anon_growth_after_trim)}"
            f" after; tracemalloc's own {format_bytes(self.tracemalloc_overhead)}"
        )
        if len(next(iter(self.series.values()), ())) > 1:
            lines.append("per iteration, growth since the baseline (threshold):")
            for name, values in self.series.items():
                shown = ", ".join(format_bytes(v) for v in values)
                limit = self.thresholds.get(name)
                suffix = f" ({format_bytes(limit)})" if limit is not None else ""
                lines.append(f"  {name}: {shown}{suffix}")
        if self.native_reason is not None:
            lines.append(f"note: native components unavailable: {self.native_reason}")
        lines.extend(f"note: {note}" for note in self.notes)
        if self.slowdown is not None:
            lines.append(
                f"cost: measured iterations ran {self.slowdown:.1f}x the untraced warm-up"
                f" (tracemalloc, {self.frames} frame{'s' if self.frames != 1 else ''})"
            )
        if self.top_sites:
            lines.append("top allocation sites (traced growth):")
            lines.extend(f"  {site}" for site in self.top_sites)
        for tip in self.advice():
            lines.append(f"next: {tip}")
        return "\n".join(lines)


# ---- the rule ------------------------------------------------------------------------------


def _slope(values: list[int]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    my = sum(values) / n
    num = sum((i - mx) * (v - my) for i, v in enumerate(values))
    den = sum((i - mx) ** 2 for i in range(n))
    return num / den


def _judge(series: list[int], threshold: int) -> tuple[int, int]:
    """(steady growth, one-time growth) of a component's series (values relative to the
    baseline, one per iteration). Steady: the least-squares slope over the iterations (the
    first excluded when there are several) times their number, if it is over ``threshold``
    and the growth has not come back down by the end."""
    if not series:
        return 0, 0
    total = series[-1]
    n = len(series)
    if total <= 0:
        return 0, 0
    if n == 1:
        return (total, 0) if total >= threshold else (0, total)
    tail = series[1:] if n > 2 else series
    rise = _slope(tail) * n
    if n == 2:
        rise = (series[1] - series[0]) * n
    peak = max(series)
    kept = series[-1] - series[0]  # growth over the iterations that is still there
    if rise < threshold or kept < rise * (n - 1) / n / 2 or total < peak - threshold:
        return 0, total
    # Intermittent growth: the slope underestimates it; what grew after the first iteration,
    # per iteration, is the leak too (the first iteration's own step may be a cache).
    steady = int(min(max(rise, kept * n / (n - 1)), total))
    return steady, total - steady


def _net_parts(
    p: _Point,
    base: _Point,
    explained: int,
    python: int = 0,
    shares: dict[str, float] | None = None,
) -> dict[str, int]:
    """Growth of each in-use part since ``base``, less what Python allocations and tracemalloc
    explain (``explained`` bytes, taken from the parts that grew, largest first: nothing is
    counted twice, and a shrinking part does not hide a growing one). With ``shares`` (the
    fraction of the traced growth in each part's block sizes), the ``python`` bytes are taken
    from their own parts only, then the rest of ``explained`` largest first."""
    grown = {k: (p.parts or {}).get(k, 0) - v for k, v in (base.parts or {}).items()}
    if "heap" in grown and p.tcache is not None and base.tcache is not None:
        grown["heap"] -= p.tcache - base.tcache  # freed chunks the tcache holds: not in use
    net = dict(grown)
    if shares:
        for key, share in shares.items():
            take = min(max(net.get(key, 0), 0), int(python * share))
            if key in net:
                net[key] -= take
        explained -= python
    for key in sorted(net, key=lambda k: -net[k]):
        take = min(max(net[key], 0), max(explained, 0))
        net[key] -= take
        explained -= take
    return net


def _size_shares(
    after: tracemalloc.Snapshot | None, before: tracemalloc.Snapshot | None, limit: int
) -> dict[str, float] | None:
    """Fractions of the traced growth in blocks of at most ``limit`` bytes ("small") and
    above ("large"), or None when nothing grew."""
    if after is None or before is None:
        return None
    small = large = 0
    for sign, snap in ((1, after), (-1, before)):
        for trace in snap.traces:
            if trace.size <= limit:
                small += sign * trace.size
            else:
                large += sign * trace.size
    small, large = max(small, 0), max(large, 0)
    if small + large <= 0:
        return None
    return {"small": small / (small + large), "large": large / (small + large)}


def _clip(value: int | None) -> int:
    return max(value or 0, 0)


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_WORKLOADS = "workloads.py"
_TRACEMALLOC = tracemalloc.__file__.removesuffix("c")  # as Filter did: a .pyc is its .py


def _own(filename: str) -> bool:
    """Whether ``filename`` is memreclaim's own code (the shared workloads are not)."""
    return filename.startswith(_PACKAGE + os.sep) and filename != os.path.join(_PACKAGE, _WORKLOADS)


def _hidden_site(filename: str) -> bool:
    """Whether an allocation made at ``filename`` (its most recent frame) is left out of the top
    sites: memreclaim's own and tracemalloc's are; the shared workloads (memreclaim.workloads:
    the demo's, the benchmarks') are the workload's, and stay."""
    return _own(filename) or filename == _TRACEMALLOC


def _top_sites(
    after: tracemalloc.Snapshot, before: tracemalloc.Snapshot, top: int
) -> tuple[AllocationSite, ...]:
    # Grouped first, filtered after: one test per traceback, not one per trace through
    # Snapshot.filter_traces (whose fnmatch per trace and filter took 10 s for 300,000 traces).
    # The same traces are dropped: a group's key holds the most recent frame a filter looks at.
    by_line: dict[tuple[str, int], list[Any]] = {}
    for diff in after.compare_to(before, "traceback"):
        if diff.size_diff <= 0 or not len(diff.traceback):
            continue
        frame = diff.traceback[-1]
        if _hidden_site(frame.filename):
            continue
        key = (frame.filename, frame.lineno)
        entry = by_line.setdefault(key, [0, 0, diff.traceback, 0])
        entry[0] += diff.size_diff
        entry[1] += diff.count_diff
        if diff.size_diff > entry[3]:
            entry[2], entry[3] = diff.traceback, diff.size_diff
    sites = []
    for (name, line), (size, count, tb, _) in by_line.items():
        if size < _MIN_SITE:
            continue
        stack = tuple(
            f"{_short(f.filename)}:{f.lineno}"
            for f in tb
            if not _own(f.filename) and "_pytest" not in f.filename and "pluggy" not in f.filename
        )
        sites.append(AllocationSite(name, line, size, count, stack))
    sites.sort(key=lambda s: -s.size)
    return tuple(sites[:top])


def diagnose(
    before: Snapshot,
    *,
    iterations: int | None = None,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    top: int = 10,
) -> Report:
    """Classify the memory growth since ``before`` (see the module docstring).

    Collects garbage, reads every component, then trims and reads RSS again. Stops tracemalloc
    if ``before`` started it (on every path, errors included); a snapshot can be diagnosed once.

    Args:
        before: from :func:`snapshot`.
        iterations: measured runs (default: the number of checkpoints, at least 1).
        noise_floor: components under this many bytes count as noise (bytes or "256 KiB").
        top: how many allocation sites to list (>= 0).

    Raises:
        TypeError, ValueError: bad arguments (nothing is measured then).
        RuntimeError: ``before`` was already diagnosed.
    """
    _validate.instance("before", before, Snapshot)
    floor = _validate.size("noise_floor", noise_floor, allow_zero=True)
    _validate.integer("top", top)
    if iterations is not None:
        _validate.integer("iterations", iterations, minimum=1)
    if before._used:
        raise RuntimeError("this snapshot was already diagnosed; take a new one")
    try:
        return _diagnose(before, iterations, floor, top)
    finally:
        before.close()


def _diagnose(before: Snapshot, iterations: int | None, floor: int, top: int) -> Report:
    from . import trim

    alloc = before.allocator
    traced = before.traced and tracemalloc.is_tracing()
    own_peak = before._sampler.stop() if before._sampler is not None else 0
    before._sampler = None
    n = iterations if iterations is not None else max(len(before.checkpoints), 1)
    complete = len(before.checkpoints) == n
    points = list(before.checkpoints) if complete else [_point(alloc, traced, tcache=True)]
    end = points[-1]
    tm_after = tracemalloc.take_snapshot() if traced else None
    ntraces_after = len(tm_after.traces) if tm_after is not None else 0
    result = trim()
    after_trim = stats()
    after_parts, after_owned, _ = _heap(alloc)
    if alloc == "mimalloc" and _mimalloc is not None and after_parts is not None:
        # Mappings found late hold mimalloc's memory at every point: recompute with all of them.
        for p in {id(p): p for p in [before.baseline, *points]}.values():
            if p.mimalloc is not None:
                p.parts, p.owned = _mimalloc.parts(p.mimalloc)
        after_parts, after_owned = _mimalloc.parts(_mimalloc.last)
    after_pymalloc = _pymalloc()
    if before.started_tracing and tracemalloc.is_tracing():
        tracemalloc.stop()
    before._used = True
    cal = _calibration or _Calibration(0.0, 16.0)
    base = before.baseline
    jit = before.jitter
    notes: list[str] = []
    margin = _MARGIN_GLIBC if alloc == "glibc" else _MARGIN_OTHER
    hidden = 1 + cal.per_trace / cal.counted_per_trace

    def threshold(jitter: int | None) -> int:
        return max(floor, _JITTER_FACTOR * (jitter or 0), 1)

    series: dict[str, list[int]] = {}
    thresholds: dict[str, int] = {}

    # Python: traced bytes.
    python_leak: int | None = None
    python_reason: str | None = None
    python_once = 0
    if traced and all(p.traced is not None for p in points) and base.traced is not None:
        series["python"] = [(p.traced or 0) - base.traced for p in points]
        thresholds["python"] = threshold(jit.traced)
        python_leak, python_once = _judge(series["python"], thresholds["python"])
    else:
        python_reason = (
            "tracemalloc was off (trace=False): Python objects are not told apart; those"
            " malloc'd (over 512 bytes) count in the native series, small ones in pymalloc's arenas"
        )
        notes.append(
            "tracemalloc was off: Python and native growth cannot be told apart; "
            "'native leak' holds all allocator in-use growth"
        )

    def python_in_malloc(p: _Point) -> int:
        """Traced growth that lives in the C allocator (not in pymalloc's arenas)."""
        if p.traced is None or base.traced is None:
            return 0
        grown = p.traced - base.traced
        if p.pymalloc is not None and base.pymalloc is not None:
            grown -= max(p.pymalloc[1] - base.pymalloc[1], 0)
        return int(max(grown, 0) * (1 + margin))

    def own_growth(p: _Point) -> int:
        return int(max(p.own - base.own, 0) * hidden)

    # Native (malloc): each part of the allocator's in-use bytes on its own.
    native_leak: int | None = None
    native_once = 0
    in_use_growth: int | None = None
    reason = before.native_reason
    if base.parts is not None and all(p.parts is not None for p in points):
        native_leak = 0
        in_use_growth = sum(end.parts.values()) - sum(base.parts.values())  # type: ignore[union-attr]
        # Where the allocator splits blocks by size, Python's share is taken from the parts
        # of its blocks' sizes (the sizes of the traced growth at the end).
        limit = {"jemalloc": _JEMALLOC_SMALL, "mimalloc": _Mimalloc._SMALL}.get(alloc)
        shares = None
        if limit is not None and {"small", "large"} <= set(base.parts):
            shares = _size_shares(tm_after, before._tracemalloc, limit)

        def net(p: _Point) -> dict[str, int]:
            python = python_in_malloc(p)
            return _net_parts(p, base, python + own_growth(p), python, shares)

        nets = [net(p) for p in points]
        kept = None
        if any(k.startswith("resident") for k in base.parts) and after_parts is not None:
            # Footprints (mimalloc), not bytes in use: what the trim gave back was free.
            after = dataclasses.replace(end, parts=after_parts, tcache=None)
            python = python_in_malloc(end)
            kept = _net_parts(after, base, python + own_growth(end), python, shares)
        for part in base.parts:
            name = f"native {part}" if len(base.parts) > 1 else "native"
            series[name] = [net[part] for net in nets]
            thresholds[name] = threshold((jit.parts or {}).get(part))
            if part.startswith("resident"):
                # A footprint moves with page acquisition: a coarser threshold, growth must
                # go on in the second half, and rise at least twice between iterations.
                thresholds[name] = max(thresholds[name], _FOOTPRINT_FACTOR * floor)
            steady, once = _judge(series[name], thresholds[name])
            values = series[name]
            late = values[-1] - values[(len(values) - 1) // 2]
            rises = sum(b - a >= thresholds[name] / 4 for a, b in itertools.pairwise(values))
            if (
                part.startswith("resident")
                and len(values) > 2
                and (late < thresholds[name] / 2 or rises < 2)
            ):
                steady, once = 0, once + steady
            if kept is not None and part.startswith("resident"):
                left = max(kept[part], 0)
                steady = min(steady, left) if min(steady, left) >= thresholds[name] else 0
                once = min(once, max(left - steady, 0))
            native_leak += steady
            native_once += once
        if alloc == "mimalloc" and "small" in base.parts:
            notes.append(
                "mimalloc 2: native bytes are those of this thread's heap; another thread's "
                "leak shows as memory outside malloc"
            )
        elif alloc == "mimalloc":
            notes.append(
                "mimalloc 3: its bytes in use cannot be read; the native figure is the resident"
                " memory of its mappings (all threads) that stays after the trim"
            )
    elif reason is None:
        reason = f"the {alloc} allocator's in-use bytes could not be read"

    # Outside malloc: shared memory, and anonymous RSS no allocator or arena owns.
    shmem_leak = 0
    shmem_once = 0
    if base.shmem is not None and all(p.shmem is not None for p in points):
        series["shared memory"] = [(p.shmem or 0) - base.shmem for p in points]
        thresholds["shared memory"] = threshold(jit.shmem)
        shmem_leak, shmem_once = _judge(series["shared memory"], thresholds["shared memory"])
    # Mapped files (RssFile): kept mappings of files a library maps per call. Code and data
    # paged in once (a module's first use) is one-time growth, not live data: not counted.
    file_leak = 0
    if base.file is not None and all(p.file is not None for p in points):
        series["mapped files"] = [(p.file or 0) - base.file for p in points]
        thresholds["mapped files"] = threshold(jit.file)
        file_leak, _ = _judge(series["mapped files"], thresholds["mapped files"])

    def arenas(p_pymalloc: tuple[int, int] | None) -> int:
        if p_pymalloc is None or base.pymalloc is None:
            return 0
        return max(p_pymalloc[0] - base.pymalloc[0], 0)

    def outside(
        anon: int | None,
        owned: int | None,
        pym: tuple[int, int] | None,
        traced: int | None,
        own: int,
    ) -> int:
        # Without pymalloc's own figures (another allocator hook is installed), the traced
        # growth stands in for its arenas: Python objects are never memory outside malloc.
        if pym is None or base.pymalloc is None:
            pymalloc = _clip((traced or 0) - (base.traced or 0)) if base.traced is not None else 0
        else:
            pymalloc = arenas(pym)
        # tracemalloc's own tables are malloc's too, but they may refill heap pages an earlier
        # trim gave back, which raises RSS and not the heap's size: never outside malloc.
        tables = int(max(own - base.own, 0) * hidden)
        mine = _clip((owned or 0) - (base.owned or 0)) + pymalloc + tables
        return (anon or 0) - (base.anon or 0) - mine

    private_leak: int | None = None
    private_once = 0
    if base.owned is not None and base.anon is not None:
        values = [outside(p.anon, p.owned, p.pymalloc, p.traced, p.own) for p in points]
        series["outside malloc"] = values
        thresholds["outside malloc"] = threshold((jit.anon or 0) + (jit.owned or 0))
        private_leak, private_once = _judge(values, thresholds["outside malloc"])
        # Confirmed after the trim: memory the allocator gave back was not outside it.
        left = outside(after_trim.rss_anon, after_owned, after_pymalloc, end.traced, end.own)
        private_leak = min(private_leak, max(left, 0))
        if private_leak < thresholds["outside malloc"]:
            private_leak = 0
    other_threads = 0  # native leak moved from outside malloc (mimalloc 2's other threads)
    if private_leak and alloc == "mimalloc" and _mimalloc is not None and native_leak is not None:
        # mimalloc 2: another thread's heap cannot be visited; growth outside this thread's
        # pages that lies in mimalloc's own mappings is that heap's: a native leak.
        raws = [p.mimalloc for p in [base, *points]]
        if all(r is not None and r[0] for r in raws):
            held = [_mimalloc.resident(r[0]) for r in raws]
            inside = [h - held[0] for h in held[1:]]
            series["native, other threads"] = inside
            moved = min(_judge(inside, thresholds["outside malloc"])[0], private_leak)
            if moved >= thresholds["outside malloc"]:
                native_leak += moved
                private_leak -= moved
                other_threads = moved
                notes.append(
                    f"{format_bytes(moved)} grew in mimalloc's mappings outside this thread's"
                    " heap: another thread's native leak"
                )
    # Shared memory is judged under every allocator; private mappings need the allocator's
    # figures (with an unknown allocator they cannot be told from malloc's: native_reason).
    mapped_leak = (private_leak or 0) + shmem_leak + file_leak

    # Threads (evidence).
    thread_growth = end.threads - base.threads
    if thread_growth > 0 and n > 1:
        t_steady, _ = _judge([p.threads - base.threads for p in points], 1)
        if t_steady:
            notes.append(f"{thread_growth} more threads than at the baseline, more each iteration")

    # Retention after the trim.
    from_tm = max(own_peak - end.own, 0)
    tm_freed = int(from_tm * hidden)
    released = max((result.released or 0) - tm_freed, 0)
    anon_growth = anon_after = None
    if base.anon is not None and result.anon_before is not None and result.anon_after is not None:
        anon_growth = result.anon_before - base.anon
        anon_after = result.anon_after - base.anon
    else:
        notes.append("anonymous RSS is unreadable (/proc): retention cannot be measured")
    traced_growth = None if end.traced is None or base.traced is None else end.traced - base.traced
    own = own_growth(end)
    if traced:
        own = max(end.own - base.own + int((ntraces_after - before._ntraces) * cal.per_trace), 0)
    native_total = max(native_leak or 0, 0) + native_once
    if after_parts is not None and base.parts is not None:
        # What the allocator holds in use and pymalloc's arenas, from their own figures.
        live = sum(after_parts.values()) - sum(base.parts.values()) + (private_leak or 0)
        live += other_threads
        live += arenas(after_pymalloc) if after_pymalloc is not None else _clip(traced_growth)
    else:
        live = _clip(traced_growth) + native_total + own + (private_leak or 0)
    pym_ret = 0
    if after_pymalloc is not None and base.pymalloc is not None:
        arena_growth = max(after_pymalloc[0] - base.pymalloc[0], 0)
        small_live = max(after_pymalloc[1] - base.pymalloc[1], 0)
        pym_ret = max(arena_growth - small_live, 0)
    rest = max((anon_after or 0) - live, 0)
    if after_parts is None or base.parts is None:
        pym_ret = min(pym_ret, rest)
        rest -= pym_ret
    arena_tops = 0
    if alloc == "glibc" and rest >= floor and after_parts is not None:
        arena_tops = min(_thread_arena_free(), rest)
        rest -= arena_tops
    elif after_parts is not None and after_owned is not None and base.parts is not None:
        # Free memory the allocator still holds after its purge (jemalloc/tcmalloc free lists,
        # mimalloc's committed free pages): retention, not pinned by live blocks.
        free_after = after_owned - sum(after_parts.values())
        free_base = (base.owned or 0) - sum(base.parts.values())
        arena_tops = min(_clip(free_after - free_base), rest)
        rest -= arena_tops
    unreclaimed = rest
    if tm_freed >= floor:
        notes.append(
            f"trim also gave back ~{format_bytes(min(tm_freed, result.released or 0))} of "
            "tracemalloc's own freed tables; not counted as allocator retention"
        )
    one_time = python_once + native_once + shmem_once  # live data kept once (caches)
    del private_once  # RSS that grew once is retention, split below, not a cache
    survivors = max(ntraces_after - before._ntraces, 0) if traced else None
    sites: tuple[AllocationSite, ...] = ()
    if tm_after is not None and before._tracemalloc is not None:
        sites = _top_sites(tm_after, before._tracemalloc, top)
    pool_reclaimable = _pool_reclaimable() if pym_ret >= floor else None
    values = [
        python_leak or 0,
        native_leak or 0,
        mapped_leak or 0,
        released + arena_tops,
        pym_ret,
        unreclaimed,
    ]
    noise = sum(v for v in values if 0 < v < floor)
    slowdown = None
    if before.untraced_seconds and before.seconds and traced:
        per = sum(before.seconds) / len(before.seconds)
        slowdown = per / before.untraced_seconds if before.untraced_seconds > 0 else None
    return Report(
        allocator=alloc,
        iterations=n,
        warmup=before.warmup,
        noise_floor=floor,
        python_leak=python_leak,
        native_leak=native_leak,
        allocator_retention=released + arena_tops,
        unreclaimed_retention=unreclaimed,
        noise=noise,
        one_time=one_time,
        traced_growth=traced_growth,
        in_use_growth=in_use_growth,
        anon_growth=anon_growth,
        anon_growth_after_trim=anon_after,
        tracemalloc_overhead=own,
        survivors=survivors,
        top_sites=sites,
        notes=tuple(notes),
        pool_reclaimable=pool_reclaimable,
        mapped_leak=mapped_leak,
        shmem_leak=shmem_leak,
        file_leak=file_leak,
        pymalloc_retention=pym_ret,
        arena_tops=arena_tops,
        native_reason=reason if native_leak is None else None,
        thread_growth=thread_growth,
        series={k: tuple(v) for k, v in series.items()},
        thresholds=thresholds,
        slowdown=slowdown,
        frames=before.frames,
        python_reason=python_reason,
        trim=result,
    )


def _thread_arena_free() -> int:
    """Free bytes in glibc's non-main arenas (their tops are not shrunk by malloc_trim)."""
    try:
        from .glibc import arenas

        return sum(a.free_bytes for a in arenas() if a.nr != 0)
    except (OSError, RuntimeError, ValueError, UnsupportedAllocatorError):
        return 0


def _pool_reclaimable() -> int | None:
    """Bytes of empty pymalloc pools that trim(pools=True) could return, or None when off."""
    if not pool_reclaim_status()["enabled"]:
        return None
    try:
        return estimate_pool_reclaim()
    except PoolReclaimUnavailable:
        return None


# ---- measure / ameasure: one implementation --------------------------------------------------


def _check_measure(
    workload: object, repeat: int, warmup: int, noise_floor: int | str, top: int, frames: int
) -> None:
    if not callable(workload):
        raise TypeError(f"workload must be callable, not {type(workload).__name__}")
    _validate.integer("repeat", repeat, minimum=1)
    _validate.integer("warmup", warmup)
    _validate.size("noise_floor", noise_floor, allow_zero=True)
    _validate.integer("top", top)
    _validate.integer("frames", frames, minimum=1, maximum=1000)


def _steps(
    repeat: int, warmup: int, noise_floor: int | str, trace: bool, frames: int, top: int
) -> Generator[str, None, Report]:
    """The measuring protocol; the caller runs the workload each time it yields "run"."""
    start = time.perf_counter()
    for _ in range(warmup):
        yield "run"
    untraced = (time.perf_counter() - start) / warmup if warmup else None
    before = snapshot(trace=trace, frames=frames)
    before.warmup = warmup
    before.untraced_seconds = untraced
    try:
        for _ in range(repeat):
            before._clock = time.perf_counter()
            yield "run"
            before.checkpoint()
    except BaseException:
        before.close()
        raise
    return diagnose(before, iterations=repeat, noise_floor=noise_floor, top=top)


def measure(
    workload: Callable[[], object],
    *,
    repeat: int = 5,
    warmup: int = 1,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    trace: bool = True,
    frames: int = DEFAULT_FRAMES,
    top: int = 10,
) -> Report:
    """Run ``workload`` ``warmup`` times, then ``repeat`` times under measurement; diagnose.

    Leak components count steady growth (see the module docstring), so a cache filled once is
    reported as ``one_time``, not as a leak. The warm-up runs untraced and timed, so the report
    says how much slower tracemalloc made the measured runs. Bad arguments raise
    TypeError/ValueError before anything runs; tracemalloc is restored on every path.

    Cost: ``frames`` (default 8) is the traceback depth of the allocation sites; ``frames=1``
    is cheaper. ``trace=False`` runs without tracemalloc (the workload at full speed): the
    native, outside-malloc and retention components are judged, ``python_leak`` is None with
    the reason in ``Report.python_reason``, and Python objects over 512 bytes count in the
    native series.
    """
    _check_measure(workload, repeat, warmup, noise_floor, top, frames)
    _validate.flag("trace", trace)
    steps = _steps(repeat, warmup, noise_floor, trace, frames, top)
    try:
        while True:
            next(steps)
            try:
                workload()
            except BaseException as exc:
                steps.throw(exc)
    except StopIteration as done:
        report: Report = done.value
        return report


async def ameasure(
    workload: Callable[[], Awaitable[object]],
    *,
    repeat: int = 5,
    warmup: int = 1,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    trace: bool = True,
    frames: int = DEFAULT_FRAMES,
    top: int = 10,
) -> Report:
    """:func:`measure` for a coroutine function: ``await workload()`` for each iteration."""
    _check_measure(workload, repeat, warmup, noise_floor, top, frames)
    _validate.flag("trace", trace)
    steps = _steps(repeat, warmup, noise_floor, trace, frames, top)
    try:
        while True:
            next(steps)
            try:
                result = workload()
                if inspect.isawaitable(result):
                    await result
            except BaseException as exc:
                steps.throw(exc)
    except StopIteration as done:
        report: Report = done.value
        return report
