"""Diagnosis engine: did this code leak, or is the allocator just holding freed memory?

The package: :mod:`._read` reads the process (through the C core), :mod:`._mimalloc` holds
mimalloc's figures, :mod:`._judge` is the rule (one judge per component, composed over a
context), :mod:`.report` the result; this module takes the snapshot and runs the protocol.

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
  call and kept; pages of code or data mapped once are one-time growth, and as one measured run
  cannot tell the two apart, mapped files are judged over two or more runs only, a note else);
* threads, as evidence.

A component leaks when its least-squares slope over the measured iterations (the first one
excluded when there are two or more: it may fill a cache) times the number of iterations is over
the threshold, and the growth has not come back down at the end (intermittent growth -- every
third call -- counts; a transient does not). The threshold of each component is the larger of
``noise_floor`` and 8 times that component's jitter, measured by reading it twice before the
first iteration. Growth that is not steady is reported as ``one_time`` (caches). Under mimalloc
the purge delay is held at 0 from the snapshot to the diagnosis (and put back after, on every
path): a freed page then goes back when it is freed, not on mimalloc's timer between two
readings, which under load moved RSS by up to 8 MiB between readings taken back to back and so
raised the thresholds over a leak of 2 MiB per run. The measured runs pay an ``madvise`` per page
freed (``docs/benchmarks/knob-cost.md``); the report's cost line includes it.

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

import dataclasses
import gc
import inspect
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Generator
from contextlib import closing
from dataclasses import dataclass, field

from .. import _core, _validate
from .._core import UnsupportedAllocatorError, allocator, stats
from ..pools import PoolReclaimUnavailable, estimate_pool_reclaim, pool_reclaim_status
from . import _mimalloc
from ._judge import After, Calibration, Context, Verdict, judge
from ._read import Point as _Point
from ._read import diff as _diff_points
from ._read import glibc_tcache as _glibc_tcache
from ._read import heap as _heap
from ._read import in_use as _in_use
from ._read import point as _point
from ._read import pymalloc as _pymalloc
from .report import LEAK_KINDS, RETENTION_KINDS, AllocationSite, Report, _top_sites

__all__ = [
    "AllocationSite",
    "Report",
    "Snapshot",
    "ameasure",
    "diagnose",
    "measure",
    "snapshot",
]
# Kept importable from here (tests and tools reach them): the readers and the report's parts.
_REEXPORTED = (_diff_points, _glibc_tcache, _heap, _pymalloc, LEAK_KINDS, RETENTION_KINDS)

DEFAULT_NOISE_FLOOR = 256 * 1024
DEFAULT_FRAMES = 8
_JEMALLOC_SMALL = 14 * 1024  # jemalloc's largest small size class (SC_SMALL_MAXCLASS)
_CALIBRATION_OBJECTS = 4000  # small: calibration must not raise the peak RSS (VmHWM)


# ---- tracemalloc's own costs ---------------------------------------------------------------


_calibration: Calibration | None = None


def _calibrate(alloc: str) -> Calibration:
    """Measure tracemalloc's per-trace bookkeeping (tracing must be on).

    tracemalloc counts its hash-table entries, but not their malloc headers nor the separately
    allocated trace records; both scale with the number of live traces. ``object()``s are
    allocated; under ``PYTHONMALLOC=malloc`` they are malloc's too, so the allocator's cost of
    as many raw 16-byte blocks (malloc'd in C, untraced) is subtracted. A few thousand objects: the
    calibration does not move the peak RSS.
    """
    global _calibration
    if _calibration is not None:
        return _calibration
    count = _CALIBRATION_OBJECTS
    gc.collect()
    if _in_use(alloc) is None:
        _calibration = Calibration(0.0, 16.0)
        return _calibration
    raw_cost = 0.0
    if _pymalloc() is None:  # objects go to malloc: learn what a 16-byte block costs there
        start = _in_use(alloc) or 0
        blocks = _core.diag_hold_blocks(count, 16)  # untraced, freed when released
        raw_cost = ((_in_use(alloc) or 0) - start) / count
        del blocks
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
    _calibration = Calibration(
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
    _hold: _mimalloc.PurgeHold | None = field(default=None, repr=False)
    _used: bool = False
    _clock: float = field(default_factory=time.perf_counter, repr=False)

    def __del__(self) -> None:
        if self._sampler is not None:  # an abandoned snapshot must not leave its thread polling
            self._sampler.cancel()
        if self._hold is not None:  # nor mimalloc's purge delay at 0
            self._hold.release()

    def close(self) -> None:
        """Stop the sampler thread, put mimalloc's purge delay back, and stop tracemalloc if this
        snapshot started it (idempotent)."""
        if self._sampler is not None:
            self._sampler.stop()
        if self._hold is not None:
            self._hold.release()
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

    Under mimalloc the purge delay is held at 0 until :func:`diagnose` or
    :meth:`Snapshot.close` (see the module docstring); if it cannot be, the report says why in
    its notes. If anything fails, tracemalloc and the delay are left as they were found.

    Raises:
        TypeError, ValueError: for a non-int or out-of-range ``frames``.
    """
    from .. import trim

    _validate.integer("frames", frames, minimum=1, maximum=1000)
    _validate.flag("trace", trace)
    _validate.flag("trim_first", trim_first)
    started = False
    sampler: _OwnPeak | None = None
    hold: _mimalloc.PurgeHold | None = None
    try:
        alloc = allocator()
        # mimalloc: freed pages go back when freed, not on a timer between two readings
        hold = _mimalloc.PurgeHold() if alloc == "mimalloc" else None
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
            _hold=hold,
        )
    except BaseException:
        if sampler is not None:
            sampler.stop()
        if hold is not None:
            hold.release()
        if started and tracemalloc.is_tracing():
            tracemalloc.stop()
        raise


# ---- the diagnosis: read the end, judge, report ----------------------------------------------


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


def _read_after(alloc: str, points: list[_Point], base: _Point) -> After:
    """Trim, then read what stayed. mimalloc: the points read before are recomputed with
    every mapping known now (a mapping found late holds mimalloc's memory at every point)."""
    from .. import trim

    result = trim()
    after_trim = stats()
    parts, owned, _ = _heap(alloc)
    mi = _mimalloc.current() if alloc == "mimalloc" else None
    mapped = None
    if mi is not None and parts is not None:
        for p in {id(p): p for p in [base, *points]}.values():
            if p.mimalloc is not None:
                p.parts, p.owned = mi.parts(p.mimalloc)
                p.mapped = mi.resident(p.mimalloc[0]) if p.mimalloc[0] else None
        parts, owned = mi.parts(mi.last)
        mapped = mi.resident(mi.last[0]) if mi.last[0] else None
    return After(
        trim=result,
        anon=after_trim.rss_anon,
        parts=parts,
        owned=owned,
        pymalloc=_pymalloc(),
        mapped=mapped,
        arena_free=_thread_arena_free,
        pool_reclaimable=_pool_reclaimable,
    )


def _diagnose(before: Snapshot, iterations: int | None, floor: int, top: int) -> Report:
    alloc = before.allocator
    traced = before.traced and tracemalloc.is_tracing()
    own_peak = before._sampler.stop() if before._sampler is not None else 0
    before._sampler = None
    n = iterations if iterations is not None else max(len(before.checkpoints), 1)
    complete = len(before.checkpoints) == n
    points = list(before.checkpoints) if complete else [_point(alloc, traced, tcache=True)]
    tm_after = tracemalloc.take_snapshot() if traced else None
    after = _read_after(alloc, points, before.baseline)
    if before.started_tracing and tracemalloc.is_tracing():
        tracemalloc.stop()
    before._used = True
    base = before.baseline
    # Where the allocator splits blocks by size, Python's share is taken from the parts of its
    # blocks' sizes (the sizes of the traced growth at the end).
    limit = {"jemalloc": _JEMALLOC_SMALL, "mimalloc": _mimalloc.SMALL}.get(alloc)
    shares = None
    if limit is not None and base.parts is not None and {"small", "large"} <= set(base.parts):
        shares = _size_shares(tm_after, before._tracemalloc, limit)
    ntraces = len(tm_after.traces) if tm_after is not None else 0
    ctx = Context(
        alloc=alloc,
        base=base,
        jitter=before.jitter,
        points=points,
        floor=floor,
        after=after,
        iterations=n,
        traced=traced,
        cal=_calibration or Calibration(0.0, 16.0),
        shares=shares,
        own_peak=own_peak,
        new_traces=ntraces - before._ntraces,
    )
    if before._hold is not None and before._hold.note is not None:
        ctx.notes.append(before._hold.note)
    verdict = judge(ctx)
    sites: tuple[AllocationSite, ...] = ()
    if tm_after is not None and before._tracemalloc is not None:
        sites = _top_sites(tm_after, before._tracemalloc, top)
    survivors = max(ntraces - before._ntraces, 0) if traced else None
    return _report(before, ctx, verdict, sites, survivors)


def _report(
    before: Snapshot,
    ctx: Context,
    v: Verdict,
    sites: tuple[AllocationSite, ...],
    survivors: int | None,
) -> Report:
    """The :class:`Report` of a verdict."""
    floor, end, base, ret = ctx.floor, ctx.end, ctx.base, v.retention
    traced_growth = None if end.traced is None or base.traced is None else end.traced - base.traced
    pool_reclaimable = ctx.after.pool_reclaimable() if ret.pymalloc >= floor else None
    values = [
        v.python.leak or 0,
        v.native_leak or 0,
        v.mapped_leak,
        ret.released + ret.arena_tops,
        ret.pymalloc,
        ret.unreclaimed,
    ]
    slowdown = None
    if before.untraced_seconds and before.seconds and ctx.traced:
        per = sum(before.seconds) / len(before.seconds)
        slowdown = per / before.untraced_seconds if before.untraced_seconds > 0 else None
    reason = before.native_reason
    if reason is None and v.native_leak is None:
        reason = f"the {ctx.alloc} allocator's in-use bytes could not be read"
    return Report(
        allocator=ctx.alloc,
        iterations=ctx.iterations,
        warmup=before.warmup,
        noise_floor=floor,
        python_leak=v.python.leak,
        native_leak=v.native_leak,
        allocator_retention=ret.released + ret.arena_tops,
        unreclaimed_retention=ret.unreclaimed,
        noise=sum(x for x in values if 0 < x < floor),
        one_time=v.one_time,
        traced_growth=traced_growth,
        in_use_growth=v.native.in_use_growth,
        anon_growth=ret.anon_growth,
        anon_growth_after_trim=ret.anon_after,
        tracemalloc_overhead=ret.overhead,
        survivors=survivors,
        top_sites=sites,
        notes=tuple(ctx.notes),
        pool_reclaimable=pool_reclaimable,
        mapped_leak=v.mapped_leak,
        shmem_leak=v.shared.shmem_leak,
        file_leak=v.shared.file_leak,
        pymalloc_retention=ret.pymalloc,
        arena_tops=ret.arena_tops,
        native_reason=reason if v.native_leak is None else None,
        thread_growth=v.thread_growth,
        series={k: tuple(x) for k, x in ctx.series.items()},
        thresholds=ctx.thresholds,
        slowdown=slowdown,
        frames=before.frames,
        python_reason=v.python.reason,
        trim=ctx.after.trim,
        untraced_python=v.python.untraced,
    )


def _thread_arena_free() -> int:
    """Free bytes in glibc's non-main arenas (their tops are not shrunk by malloc_trim)."""
    try:
        from ..glibc import arenas

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

#: Bounds of the runs a measurement makes: a typo such as ``warmup=2**70`` is an error at the
#: call, not a test that runs until its timeout.
MAX_RUNS = 100_000
MAX_CALLS = 10**12


def _trace_mode(trace: object) -> bool | str:
    """``True``, ``False`` or ``"auto"`` (anything else: TypeError)."""
    if trace == "auto":
        return "auto"
    if isinstance(trace, str):
        raise TypeError(f"trace must be True, False or 'auto', not {trace!r}")
    return _validate.flag("trace", trace)


def _runs(name: str, value: object, minimum: int) -> int:
    """A count of runs in ``[minimum, MAX_RUNS]``."""
    return _validate.integer(name, value, minimum=minimum, maximum=MAX_RUNS)


def calls_per_run(calls: object) -> int | None:
    """``calls`` (None, or a whole number of calls per run in ``[1, MAX_CALLS]``)."""
    return (
        None if calls is None else _validate.integer("calls", calls, minimum=1, maximum=MAX_CALLS)
    )


def _needs_tracing(report: Report) -> bool:
    """Whether an untraced pass found growth that only a traced pass can attribute: a leak of
    any kind, or steady growth of pymalloc's blocks (small Python objects)."""
    return bool(report.leaks()) or (report.untraced_python or 0) > 0


class _Protocol:
    """The measuring protocol of :func:`measure`, :func:`ameasure` and the pytest markers,
    checked at construction: the caller runs the workload once per item of :meth:`runs`, then
    takes :meth:`report`.

    ``trace="auto"``: the measured runs go untraced first (allocator, RSS and pymalloc
    readings: the workload at full speed); only when that pass finds growth (a leak, or
    pymalloc's blocks growing) are ``repeat`` more runs made under tracemalloc, whose report
    (verdict, sites) is the result. A single shot (``repeat=1, warmup=0``) is traced from the
    start: its first run cannot be measured again."""

    def __init__(
        self,
        workload: object,
        repeat: int,
        warmup: int,
        noise_floor: int | str,
        trace: bool | str,
        frames: int,
        top: int,
        calls: int | None = None,
    ) -> None:
        if not callable(workload):
            raise TypeError(f"workload must be callable, not {type(workload).__name__}")
        _runs("repeat", repeat, 1)
        _runs("warmup", warmup, 0)
        _validate.size("noise_floor", noise_floor, allow_zero=True)
        _validate.integer("top", top)
        _validate.integer("frames", frames, minimum=1, maximum=1000)
        mode = _trace_mode(trace)
        self._calls = calls_per_run(calls)
        if mode == "auto" and repeat == 1 and warmup == 0:
            mode = True
        self._repeat, self._warmup, self._noise_floor = repeat, warmup, noise_floor
        self._trace, self._frames, self._top = mode, frames, top
        self._report: Report | None = None
        self._seconds: float | None = None

    def runs(self) -> Generator[bool, None, None]:
        """One item per run of the workload: the warm-up (untraced, timed), then the measured
        runs; the item is True for the last run of the first measured pass. Closed early (the
        workload raised), it undoes the snapshot's tracing."""
        start = time.perf_counter()
        for _ in range(self._warmup):
            yield False
        untraced = (time.perf_counter() - start) / self._warmup if self._warmup else None
        first = yield from self._pass(self._trace is True, untraced, last=True)
        if self._trace == "auto" and _needs_tracing(first):
            report = yield from self._pass(True, self._seconds or untraced, last=False)
            note = (
                "the first pass (untraced) found growth: measured again under tracemalloc"
                f" ({self._repeat} more run{'s' if self._repeat != 1 else ''}) to attribute it"
            )
            first = dataclasses.replace(report, notes=(*report.notes, note))
        elif self._trace == "auto":
            notes = [n for n in first.notes if not n.startswith("tracemalloc was off")]
            notes.append(
                "trace='auto': the measured runs went untraced; nothing grew that tracemalloc"
                " had to attribute"
            )
            first = dataclasses.replace(first, notes=tuple(notes))
        if "native_leak" in first.leaks() and self._trace is not False:  # False: no tracer
            first = yield from self._native_pass(first)
        self._report = dataclasses.replace(first, calls=self._calls)

    def _native_pass(self, report: Report) -> Generator[bool, None, Report]:
        """A native leak: ``repeat`` more runs under memray's native tracker (where installed)
        name the function and shared object that allocate the growing blocks (glibc's malloc
        only: see ``_native``)."""
        from ._native import NativeTrace

        trace = NativeTrace(report.allocator)
        with trace:
            for _ in range(self._repeat if trace.reason is None else 0):
                yield False
        found = trace.sites()
        if not isinstance(found, str) and (
            not found or found[0].size * 2 < (report.native_leak or 0)
        ):
            found = (
                "memray's traces did not see most of the leaked blocks (a malloc reached through"
                " a pointer its hooks do not patch, such as ctypes' libc.malloc, or another"
                " thread's): no function is named"
            )
        if isinstance(found, str):
            return dataclasses.replace(report, notes=(*report.notes, f"native sites: {found}"))
        note = (
            f"native sites: from memray's native traces over {self._repeat} more"
            f" run{'s' if self._repeat != 1 else ''}"
        )
        return dataclasses.replace(
            report,
            native_sites=tuple(str(site) for site in found),
            native_owner=found[0].where if found else None,
            notes=(*report.notes, note),
        )

    def _pass(
        self, traced: bool, untraced: float | None, last: bool
    ) -> Generator[bool, None, Report]:
        """``repeat`` measured runs from a snapshot (traced or not), diagnosed."""
        before = snapshot(trace=traced, frames=self._frames)
        before.warmup = self._warmup
        before.untraced_seconds = untraced
        try:
            for i in range(self._repeat):
                before._clock = time.perf_counter()
                yield last and i == self._repeat - 1
                before.checkpoint()
        except BaseException:  # GeneratorExit from closing(): the workload raised
            before.close()
            raise
        report = diagnose(
            before, iterations=self._repeat, noise_floor=self._noise_floor, top=self._top
        )
        if not traced and before.seconds:  # the runs' own untraced time, for the cost line
            self._seconds = sum(before.seconds) / len(before.seconds)
        return report

    def report(self) -> Report:
        """The diagnosis of the finished runs."""
        if self._report is None:
            raise RuntimeError("the measured runs did not finish")
        return self._report


def measure(
    workload: Callable[[], object],
    *,
    repeat: int = 5,
    warmup: int = 1,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    trace: bool | str = "auto",
    frames: int = DEFAULT_FRAMES,
    top: int = 10,
    calls: int | None = None,
) -> Report:
    """Run ``workload`` ``warmup`` times, then ``repeat`` times under measurement; diagnose.

    Leak components count steady growth (see the module docstring), so a cache filled once is
    reported as ``one_time``, not as a leak. Bad arguments raise TypeError/ValueError before
    anything runs (``repeat``/``warmup`` over ``MAX_RUNS`` too); tracemalloc is restored on every
    path.

    Cost: ``trace="auto"`` (the default) measures untraced first and pays tracemalloc only when
    that pass finds growth: then ``repeat`` more runs are made traced, and their report (with
    the allocation sites) is returned; a single shot (``repeat=1, warmup=0``) is traced from the
    start. ``trace=True`` traces the measured runs at once; ``frames`` (default 8) is the
    traceback depth of the allocation sites (``frames=1`` is cheaper). ``trace=False`` never
    traces: the native, outside-malloc and retention components are judged, ``python_leak`` is
    None with the reason in ``Report.python_reason``, and Python objects over 512 bytes count in
    the native series. The warm-up runs untraced and timed, so the report says how much slower
    tracemalloc made the measured runs. ``calls``: how many calls of the code under test one
    run makes; the report then gives the leak per call (:attr:`Report.leak_per_call`).
    """
    protocol = _Protocol(workload, repeat, warmup, noise_floor, trace, frames, top, calls)
    with closing(protocol.runs()) as runs:
        for _ in runs:
            workload()
    return protocol.report()


async def ameasure(
    workload: Callable[[], Awaitable[object]],
    *,
    repeat: int = 5,
    warmup: int = 1,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    trace: bool | str = "auto",
    frames: int = DEFAULT_FRAMES,
    top: int = 10,
    calls: int | None = None,
) -> Report:
    """:func:`measure` for a coroutine function: ``await workload()`` for each iteration."""
    protocol = _Protocol(workload, repeat, warmup, noise_floor, trace, frames, top, calls)
    with closing(protocol.runs()) as runs:
        for _ in runs:
            result = workload()
            if inspect.isawaitable(result):
                await result
    return protocol.report()
