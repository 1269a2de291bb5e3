"""Diagnosis engine: did this code leak, or is the allocator just holding freed memory?

    >>> before = memreclaim.snapshot()      # gc, trim, start tracemalloc, read the baseline
    >>> work()
    >>> report = memreclaim.diagnose(before)
    >>> print(report.format())              # verdict, components in bytes, top allocation sites

or, to judge growth per iteration so that one-time caches are not called leaks::

    >>> report = memreclaim.measure(work, repeat=5, warmup=1)

How the growth between the snapshot and the diagnosis is split (all in bytes):

* **python_leak** -- memory traced by tracemalloc that is still referenced after ``gc.collect()``.
* **native_leak** -- growth of the allocator's in-use bytes (glibc ``uordblks + hblkhd``, jemalloc
  ``stats.allocated``, tcmalloc ``current_allocated_bytes``) beyond what tracemalloc explains: C
  code that mallocs without freeing. Python objects of 512 bytes or less live in pymalloc arenas,
  which CPython maps directly, so they never appear in the allocator's in-use bytes; larger
  objects and raw allocations do, and are subtracted from the trace sizes, as is tracemalloc's
  own bookkeeping (measured once per process). ``None`` when the allocator has no such counter
  (mimalloc, unknown allocators).
* **allocator_retention** -- anonymous RSS that :func:`memreclaim.trim` gave back at diagnosis:
  memory that was freed but kept by the allocator. Not a leak.
* **unreclaimed_retention** -- anonymous RSS growth left after the trim that is neither a leak
  nor tracemalloc's own memory: pymalloc arenas or heap pages pinned by a few surviving blocks,
  fragmentation. Not a leak, but the process does not get it back.
* **noise** -- the sum of the components above that are under the noise floor.

In repeat mode the leak components count only *steady* growth: the median growth per iteration
times the number of iterations, so growth that happens once (a cache filled on first use) is
reported as ``one_time`` instead.
"""

from __future__ import annotations

import gc
import itertools
import os
import statistics
import threading
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._core import allocator, heap_stats, stats, trim
from .pools import PoolReclaimUnavailable, estimate_pool_reclaim, pool_reclaim_status
from .units import format_bytes, parse_bytes

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
_MARGIN_GLIBC = 0.05  # uncertainty of the malloc-side estimate of traced allocations
_MARGIN_OTHER = 0.25
_MIN_SITE = 1024  # allocation sites that gained less are not listed
_PYMALLOC_MAX = 512  # SMALL_REQUEST_THRESHOLD: larger requests go to the C allocator
_CALIBRATION_OBJECTS = 20_000

_COMPONENT_LABELS = {
    "python_leak": "Python leak",
    "native_leak": "native leak",
    "allocator_retention": "allocator retention",
    "unreclaimed_retention": "unreclaimed retention",
}


def _threshold(value: int | str, name: str) -> int:
    try:
        return parse_bytes(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


def _check_count(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _pymalloc_max() -> int:
    """Largest request served by pymalloc (0 when PYTHONMALLOC routes everything to malloc)."""
    if os.environ.get("PYTHONMALLOC", "") in ("malloc", "malloc_debug"):
        return 0
    return _PYMALLOC_MAX


def _malloc_backed(snap: tracemalloc.Snapshot) -> tuple[int, int, int]:
    """(bytes and number of traces served by the C allocator, number of all traces)."""
    limit = _pymalloc_max()
    total = 0
    blocks = 0
    count = 0
    for trace in snap.traces:
        count += 1
        if trace.size > limit or trace.domain != 0:
            total += trace.size
            blocks += 1
    return total, blocks, count


def _in_use() -> int | None:
    return heap_stats().in_use


@dataclass(frozen=True)
class _Calibration:
    """tracemalloc's and the allocator's hidden costs, measured once per process (bytes)."""

    per_trace: float  # allocator bytes per live trace that get_tracemalloc_memory() omits
    counted_per_trace: float  # bytes per trace entry that get_tracemalloc_memory() counts
    per_block: float  # allocator overhead (header, rounding) per malloc-backed block


_calibration: _Calibration | None = None


def _calibrate() -> _Calibration:
    """Measure tracemalloc's bookkeeping and malloc's per-block overhead (tracing must be on).

    tracemalloc counts its hash-table entries, but not their malloc headers nor the separately
    allocated trace records; both scale with the number of live traces. Blocks over 512 bytes
    cost their size plus a header and rounding in the allocator's in-use bytes.
    """
    global _calibration
    if _calibration is not None:
        return _calibration
    count = _CALIBRATION_OBJECTS
    gc.collect()
    in_use0 = _in_use()
    if in_use0 is None:
        _calibration = _Calibration(0.0, 0.0, 0.0)
        return _calibration
    holder: list[object] = [None] * count
    gc.collect()
    in_use0 = _in_use() or 0
    traced0 = tracemalloc.get_traced_memory()[0]
    own0 = tracemalloc.get_tracemalloc_memory()
    steps: list[int] = []
    mark = own0
    for i in range(count):
        holder[i] = object()
        if i % 1000 == 999:
            now = tracemalloc.get_tracemalloc_memory()
            steps.append(now - mark)
            mark = now
    in_use1 = _in_use() or 0
    traced1 = tracemalloc.get_traced_memory()[0]
    own1 = tracemalloc.get_tracemalloc_memory()
    small_in_malloc = 0 if _pymalloc_max() else traced1 - traced0
    per_trace = (in_use1 - in_use0 - (own1 - own0) - small_in_malloc) / count
    # Per entry without hash-table resizes: the smallest step (a resize lands in one step).
    counted = min(steps) / 1000 if steps else (own1 - own0) / count
    # Malloc-backed blocks of assorted sizes (600 B - 4 KiB), same number of traces.
    for i in range(count):
        holder[i] = bytes(600 + (i * 181) % 3500)
    in_use2 = _in_use() or 0
    traced2 = tracemalloc.get_traced_memory()[0]
    own2 = tracemalloc.get_tracemalloc_memory()
    per_block = (in_use2 - in_use0 - (own2 - own0) - (traced2 - traced0)) / count - per_trace
    del holder
    _calibration = _Calibration(
        per_trace=min(max(per_trace, 0.0), 256.0),
        counted_per_trace=min(max(counted, 1.0), 256.0),
        per_block=min(max(per_block, 0.0), 64.0),
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


@dataclass
class _Point:
    traced: int
    tracemalloc_own: int
    in_use: int | None


def _point(traced: bool) -> _Point:
    gc.collect()
    if traced:
        return _Point(
            tracemalloc.get_traced_memory()[0], tracemalloc.get_tracemalloc_memory(), _in_use()
        )
    return _Point(0, 0, _in_use())


@dataclass
class Snapshot:
    """Baseline for :func:`diagnose`, from :func:`snapshot`. Call :meth:`checkpoint` after each
    iteration of a repeated workload so the diagnosis can tell steady from one-time growth."""

    allocator: str
    traced: bool
    started_tracing: bool
    baseline: _Point
    anon: int | None
    trim_released: int | None
    warmup: int = 0
    checkpoints: list[_Point] = field(default_factory=list)
    _tracemalloc: tracemalloc.Snapshot | None = field(default=None, repr=False)
    _malloc_traced: int = 0
    _malloc_blocks: int = 0
    _ntraces: int = 0
    _sampler: _OwnPeak | None = field(default=None, repr=False)
    _used: bool = False

    def __del__(self) -> None:
        if self._sampler is not None:  # an abandoned snapshot must not leave its thread polling
            self._sampler.cancel()

    def close(self) -> None:
        """Stop the sampler thread and tracemalloc if this snapshot started them (idempotent)."""
        if self._sampler is not None:
            self._sampler.stop()
        if self.started_tracing and not self._used and tracemalloc.is_tracing():
            tracemalloc.stop()
        self._used = True

    def checkpoint(self) -> None:
        """Record the end of one iteration (a ``gc.collect()`` and cheap counters)."""
        if self._used:
            raise RuntimeError("this snapshot was already diagnosed; take a new one")
        self.checkpoints.append(_point(self.traced and tracemalloc.is_tracing()))


def snapshot(*, trace: bool = True, frames: int = 1, trim_first: bool = True) -> Snapshot:
    """Record the baseline that :func:`diagnose` compares against.

    Args:
        trace: start tracemalloc (with ``frames`` frames) if it is not running; :func:`diagnose`
            stops it again. Without tracing, Python and native growth cannot be told apart.
        frames: traceback depth for tracemalloc when this call starts it (>= 1).
        trim_first: trim the allocator first, so the trim at diagnosis returns only what the
            measured code left behind.

    Raises:
        TypeError, ValueError: for a non-int or out-of-range ``frames``.
    """
    _check_count(frames, "frames", 1)
    started = False
    if trace and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
        started = True
    traced = tracemalloc.is_tracing()
    if traced:
        _calibrate()
    gc.collect()
    released = trim().released if trim_first else None
    sampler = _OwnPeak() if traced else None  # started first: its allocations predate the baseline
    tm_snap = tracemalloc.take_snapshot() if traced else None
    malloc_traced, malloc_blocks, ntraces = (
        _malloc_backed(tm_snap) if tm_snap is not None else (0, 0, 0)
    )
    base = _point(traced)
    return Snapshot(
        allocator=allocator(),
        traced=traced,
        started_tracing=started,
        baseline=base,
        anon=stats().rss_anon,
        trim_released=released,
        _tracemalloc=tm_snap,
        _malloc_traced=malloc_traced,
        _malloc_blocks=malloc_blocks,
        _ntraces=ntraces,
        _sampler=sampler,
    )


@dataclass(frozen=True)
class AllocationSite:
    """A source line whose traced memory grew: ``filename:lineno``, bytes and blocks gained."""

    filename: str
    lineno: int
    size: int
    count: int

    def __str__(self) -> str:
        name = self.filename
        cwd = os.getcwd() + os.sep
        if name.startswith(cwd):  # shorter, and clickable from the working directory
            name = name[len(cwd) :]
        return f"{name}:{self.lineno}: +{format_bytes(self.size)} in {self.count:+d} blocks"


@dataclass(frozen=True)
class Report:
    """The diagnosis: growth since a :class:`Snapshot`, split into components (bytes).

    ``python_leak`` is None without tracemalloc; ``native_leak`` is None when the allocator has
    no in-use counter (mimalloc, unknown). ``iterations`` counts measured runs (warm-up excluded);
    leak components are steady growth over all of them. See the module docstring for the rules.
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

    def components(self) -> dict[str, int]:
        """The four measured components (missing ones as 0), largest first, noise last."""
        values = {
            "python_leak": self.python_leak or 0,
            "native_leak": self.native_leak or 0,
            "allocator_retention": self.allocator_retention,
            "unreclaimed_retention": self.unreclaimed_retention,
        }
        ordered = dict(sorted(values.items(), key=lambda kv: -kv[1]))
        ordered["noise"] = self.noise
        return ordered

    def significant(self) -> dict[str, int]:
        """Components at or above the noise floor, largest first."""
        return {
            k: v
            for k, v in self.components().items()
            if k != "noise" and v > 0 and v >= self.noise_floor
        }

    @property
    def kind(self) -> str:
        """The largest significant component's name, or ``"clean"``."""
        sig = self.significant()
        return next(iter(sig)) if sig else "clean"

    @property
    def leak(self) -> int:
        """Steady leak (Python + native) over all measured iterations, in bytes."""
        return (self.python_leak or 0) + (self.native_leak or 0)

    @property
    def leak_per_iteration(self) -> int:
        """:attr:`leak` divided by the number of measured iterations."""
        return self.leak // self.iterations

    @property
    def retained(self) -> int:
        """Anonymous RSS growth a trim did not give back (leaks + unreclaimed retention)."""
        return self.leak + self.unreclaimed_retention

    @property
    def verdict(self) -> str:
        """One line: the significant components, largest first, with what each means."""
        sig = self.significant()
        if not sig:
            return (
                f"no significant growth (everything under the {format_bytes(self.noise_floor)}"
                " noise floor)"
            )
        parts = []
        for name, value in sig.items():
            text = f"{_COMPONENT_LABELS[name]} {format_bytes(value)}"
            extra = []
            if name in ("python_leak", "native_leak") and self.iterations > 1:
                extra.append(f"{format_bytes(value // self.iterations)} per iteration")
            if name == "native_leak" and self.traced_growth is not None:
                extra.append(f"tracemalloc saw {format_bytes(max(self.traced_growth, 0))}")
            if extra:
                text += f" ({', '.join(extra)})"
            if name == "allocator_retention":
                text += " (given back by trim, not a leak)"
            elif name == "unreclaimed_retention":
                text += " (" + self._pinned_text() + ")"
            parts.append(text)
        return "; ".join(parts)

    def _pinned_text(self) -> str:
        if self.native_leak is None:
            return (
                "not live in Python and not returned by trim: a native leak (undetectable with "
                f"{self.allocator}), pinned pages or fragmentation"
            )
        if self.survivors:
            text = (
                f"not live and not returned by trim: pymalloc arenas or heap pages pinned by "
                f"{self.survivors:,} surviving blocks, not a leak"
            )
            if self.pool_reclaimable:
                text += (
                    f"; pool reclaim can return {format_bytes(self.pool_reclaimable)} of it"
                    " (trim(pools=True))"
                )
            return text
        return "not live and not returned by trim: pinned pages or fragmentation, not a leak"

    def advice(self) -> list[str]:
        """What to do next, one line per significant component."""
        tips = {
            "python_leak": "Python objects stay referenced: see the top sites below for who "
            "allocated them (module-level lists/dicts, unbounded caches, closures).",
            "native_leak": "C code allocated without freeing; tracemalloc cannot see it. Run the "
            "workload under `memray run --native` or valgrind/heaptrack to find the caller.",
            "allocator_retention": "Freed memory the allocator kept; memreclaim.trim() (or a "
            "watchdog) gives it back.",
            "unreclaimed_retention": "A few long-lived objects allocated during the spike pin "
            "whole arenas/pages: create long-lived objects before the spike, or copy them out.",
        }
        if self.pool_reclaimable is None and _pymalloc_max():
            tips["unreclaimed_retention"] += (
                " On CPython 3.11+, memreclaim.enable_pool_reclaim() at start-up lets"
                " trim(pools=True) give back the empty pymalloc pools in pinned arenas."
            )
        elif self.pool_reclaimable:
            tips["unreclaimed_retention"] += (
                f" trim(pools=True) gives back {format_bytes(self.pool_reclaimable)} of it now."
            )
        return [tips[name] for name in self.significant()]

    def format(self) -> str:
        """A human-readable multi-line report: verdict, components, raw figures, top sites."""
        run = f"{self.iterations} iteration{'s' if self.iterations != 1 else ''}"
        if self.warmup:
            run += f" after {self.warmup} warm-up"
        lines = [
            f"memreclaim diagnosis ({self.allocator}, {run})",
            f"verdict: {self.verdict}",
        ]
        width = max(len(label) for label in _COMPONENT_LABELS.values())
        for name, value in self.components().items():
            label = _COMPONENT_LABELS.get(name, "noise")
            raw: int | None = getattr(self, name)
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
            f"raw: traced {fmt(self.traced_growth)}, allocator in-use {fmt(self.in_use_growth)}, "
            f"anon RSS {fmt(self.anon_growth)} before trim, {fmt(self.anon_growth_after_trim)}"
            f" after; tracemalloc's own {format_bytes(self.tracemalloc_overhead)}"
        )
        lines.extend(f"note: {note}" for note in self.notes)
        if self.top_sites:
            lines.append("top allocation sites (traced growth):")
            lines.extend(f"  {site}" for site in self.top_sites)
        for tip in self.advice():
            lines.append(f"next: {tip}")
        return "\n".join(lines)


def _steady(total: int, deltas: list[int]) -> int:
    """Growth that repeats: median per-iteration growth times iterations, within [0, total]."""
    if total <= 0:
        return 0
    if len(deltas) <= 1:
        return total
    per = statistics.median(deltas)
    return int(min(max(per * len(deltas), 0), total))


def _top_sites(
    after: tracemalloc.Snapshot, before: tracemalloc.Snapshot, top: int
) -> tuple[AllocationSite, ...]:
    here = os.path.abspath(__file__)
    filters = [
        tracemalloc.Filter(False, here),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    diffs = after.filter_traces(filters).compare_to(before.filter_traces(filters), "lineno")
    sites: list[AllocationSite] = []
    for diff in diffs:
        if diff.size_diff < _MIN_SITE or len(sites) >= top:
            continue
        frame = diff.traceback[0]
        sites.append(AllocationSite(frame.filename, frame.lineno, diff.size_diff, diff.count_diff))
    return tuple(sorted(sites, key=lambda s: -s.size))


def diagnose(
    before: Snapshot,
    *,
    iterations: int | None = None,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    top: int = 10,
) -> Report:
    """Classify the memory growth since ``before`` (see the module docstring).

    Collects garbage, reads traced memory, the allocator's in-use bytes and anonymous RSS, then
    trims and reads RSS again. Stops tracemalloc if ``before`` started it; a snapshot can be
    diagnosed once.

    Args:
        before: from :func:`snapshot`.
        iterations: measured runs (default: the number of checkpoints, at least 1).
        noise_floor: components under this many bytes count as noise (bytes or "256 KiB").
        top: how many allocation sites to list (>= 0).

    Raises:
        TypeError, ValueError: bad arguments (nothing is measured then).
        RuntimeError: ``before`` was already diagnosed.
    """
    if not isinstance(before, Snapshot):
        raise TypeError(f"before must be a Snapshot from snapshot(), not {type(before).__name__}")
    floor = _threshold(noise_floor, "noise_floor")
    _check_count(top, "top", 0)
    if iterations is not None:
        _check_count(iterations, "iterations", 1)
    if before._used:
        raise RuntimeError("this snapshot was already diagnosed; take a new one")
    traced = before.traced and tracemalloc.is_tracing()
    own_peak = before._sampler.stop() if before._sampler is not None else 0
    end = _point(traced)
    result = trim()
    tm_after = tracemalloc.take_snapshot() if traced else None
    before._used = True
    if before.started_tracing:
        tracemalloc.stop()
    cal = _calibration or _Calibration(0.0, 0.0, 0.0)

    notes: list[str] = []
    base = before.baseline
    n = iterations if iterations is not None else max(len(before.checkpoints), 1)
    # Per-iteration series when every iteration was checkpointed; else one step for the block.
    series = [base, *before.checkpoints] if len(before.checkpoints) == n else [base, end]

    # Python: traced growth, steady part only.
    python_leak: int | None = None
    traced_growth: int | None = None
    tm_overhead = 0
    tm_freed = 0
    survivors: int | None = None
    malloc_traced = 0
    sites: tuple[AllocationSite, ...] = ()
    if traced and tm_after is not None and before._tracemalloc is not None:
        traced_growth = end.traced - base.traced
        deltas = [b.traced - a.traced for a, b in itertools.pairwise(series)]
        python_leak = _steady(traced_growth, deltas)
        malloc_after, blocks_after, ntraces_after = _malloc_backed(tm_after)
        malloc_traced = malloc_after - before._malloc_traced
        malloc_traced += int((blocks_after - before._malloc_blocks) * cal.per_block)
        survivors = max(ntraces_after - before._ntraces, 0)
        tm_overhead = max(
            end.tracemalloc_own
            - base.tracemalloc_own
            + int((ntraces_after - before._ntraces) * cal.per_trace),
            0,
        )
        # tracemalloc's tables shrank from their peak: that freed memory is its, not the code's.
        shrunk = max(own_peak - end.tracemalloc_own, 0)
        ratio = cal.per_trace / cal.counted_per_trace if cal.counted_per_trace > 0 else 0.0
        tm_freed = int(shrunk * (1 + ratio))
        sites = _top_sites(tm_after, before._tracemalloc, top)
    else:
        notes.append(
            "tracemalloc was off: Python and native growth cannot be told apart; "
            "'native leak' holds all allocator in-use growth"
        )

    # Native: allocator in-use growth beyond the traced malloc-backed part and tracemalloc's own.
    native_leak: int | None = None
    in_use_growth: int | None = None
    native_total = 0
    unexplained = 0  # in-use growth beyond the traced estimates (native leak + margin)
    if end.in_use is not None and base.in_use is not None:
        in_use_growth = end.in_use - base.in_use
        # The subtracted estimates are good to a few % on glibc (measured per block); other
        # allocators round to size classes, so allow a wider margin before calling it native.
        explained = malloc_traced + tm_overhead
        margin = int(explained * (_MARGIN_GLIBC if before.allocator == "glibc" else _MARGIN_OTHER))
        unexplained = max(in_use_growth - explained, 0)
        native_total = max(in_use_growth - explained - margin, 0)
        if margin >= floor:
            notes.append(
                f"native leak is counted beyond a {format_bytes(margin)} margin for the "
                "allocator's overhead on the Python allocations it holds"
            )
        deltas = []
        for a, b in itertools.pairwise(series):
            if a.in_use is not None and b.in_use is not None:
                deltas.append(b.in_use - a.in_use - (b.tracemalloc_own - a.tracemalloc_own))
        native_leak = _steady(native_total, deltas)
    else:
        notes.append(
            f"native-leak detection is unavailable: the {before.allocator} allocator reports no"
            " in-use bytes; native leaks show up as unreclaimed retention"
        )

    one_time = max((traced_growth or 0) - (python_leak or 0), 0) + max(
        native_total - (native_leak or 0), 0
    )

    # RSS: what trim gave back, and what stayed that is neither live nor tracemalloc's own.
    anon_growth = anon_after = None
    released = max((result.released or 0) - tm_freed, 0)
    if before.anon is not None and result.anon_before is not None and result.anon_after is not None:
        anon_growth = result.anon_before - before.anon
        anon_after = result.anon_after - before.anon
    else:
        notes.append("anonymous RSS is unreadable (/proc): retention cannot be measured")
    live = max(traced_growth or 0, 0) + unexplained + tm_overhead
    unreclaimed = max((anon_after or 0) - live, 0)
    if tm_freed >= floor:
        notes.append(
            f"trim also gave back ~{format_bytes(min(tm_freed, result.released or 0))} of "
            "tracemalloc's own freed tables; not counted as allocator retention"
        )

    pool_reclaimable = _pool_reclaimable() if unreclaimed >= floor else None
    values = [python_leak or 0, native_leak or 0, released, unreclaimed]
    noise = sum(v for v in values if 0 < v < floor)
    return Report(
        allocator=before.allocator,
        iterations=n,
        warmup=before.warmup,
        noise_floor=floor,
        python_leak=python_leak,
        native_leak=native_leak,
        allocator_retention=released,
        unreclaimed_retention=unreclaimed,
        noise=noise,
        one_time=one_time,
        traced_growth=traced_growth,
        in_use_growth=in_use_growth,
        anon_growth=anon_growth,
        anon_growth_after_trim=anon_after,
        tracemalloc_overhead=tm_overhead,
        survivors=survivors,
        top_sites=sites,
        notes=tuple(notes),
        pool_reclaimable=pool_reclaimable,
    )


def _pool_reclaimable() -> int | None:
    """Bytes of empty pymalloc pools that trim(pools=True) could return, or None when off."""
    if not pool_reclaim_status()["enabled"]:
        return None
    try:
        return estimate_pool_reclaim()
    except PoolReclaimUnavailable:
        return None


def _check_repeat(repeat: int, warmup: int) -> None:
    _check_count(repeat, "repeat", 1)
    _check_count(warmup, "warmup", 0)


def measure(
    workload: Callable[[], object],
    *,
    repeat: int = 5,
    warmup: int = 1,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    trace: bool = True,
    frames: int = 1,
    top: int = 10,
) -> Report:
    """Run ``workload`` ``warmup`` times, then ``repeat`` times under measurement; diagnose.

    Leak components count steady growth (median per iteration x ``repeat``), so a cache filled
    once is reported as ``one_time``, not as a leak. Bad arguments raise TypeError/ValueError
    before anything runs.
    """
    if not callable(workload):
        raise TypeError(f"workload must be callable, not {type(workload).__name__}")
    _check_repeat(repeat, warmup)
    _threshold(noise_floor, "noise_floor")
    _check_count(top, "top", 0)
    for _ in range(warmup):
        workload()
    before = snapshot(trace=trace, frames=frames)
    before.warmup = warmup
    try:
        for _ in range(repeat):
            workload()
            before.checkpoint()
    except BaseException:
        before.close()
        raise
    return diagnose(before, iterations=repeat, noise_floor=noise_floor, top=top)


async def ameasure(
    workload: Callable[[], Awaitable[object]],
    *,
    repeat: int = 5,
    warmup: int = 1,
    noise_floor: int | str = DEFAULT_NOISE_FLOOR,
    trace: bool = True,
    frames: int = 1,
    top: int = 10,
) -> Report:
    """:func:`measure` for a coroutine function: ``await workload()`` for each iteration."""
    if not callable(workload):
        raise TypeError(f"workload must be callable, not {type(workload).__name__}")
    _check_repeat(repeat, warmup)
    _threshold(noise_floor, "noise_floor")
    _check_count(top, "top", 0)
    for _ in range(warmup):
        await workload()
    before = snapshot(trace=trace, frames=frames)
    before.warmup = warmup
    try:
        for _ in range(repeat):
            await workload()
            before.checkpoint()
    except BaseException:
        before.close()
        raise
    return diagnose(before, iterations=repeat, noise_floor=noise_floor, top=top)
