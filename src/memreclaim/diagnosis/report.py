"""The diagnosis's result: :class:`Report` (verdict, components, evidence, advice, text) and
:class:`AllocationSite` (a source line whose traced memory grew), with the top-sites reader."""

from __future__ import annotations

import dataclasses
import os
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

from .._core import TrimResult
from ..units import format_bytes

_MIN_SITE = 1024  # allocation sites that gained less are not listed

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


@dataclass(frozen=True)
class AllocationSite:
    """A source line whose traced memory grew: ``filename:lineno``, bytes and blocks gained, and
    the call stack that led there (outermost first, up to the ``frames`` traced)."""

    filename: str
    lineno: int
    size: int
    count: int
    traceback: tuple[str, ...] = ()
    #: The installed distribution the allocation belongs to ("ujson 5.12.0 (C extension
    #: ujson.cpython-311-x86_64-linux-gnu.so)"): the file's own, or that of a C extension whose
    #: function is called on the line; None for the user's code and the standard library.
    owner: str | None = None

    def __str__(self) -> str:
        text = f"{_short(self.filename)}:{self.lineno}: +{format_bytes(self.size)} in"
        text += f" {self.count:+d} blocks"
        if self.owner is not None:
            text += f" [inside {self.owner}]"
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
    #: Without tracemalloc: steady growth of pymalloc's allocated small blocks (bytes), the
    #: untraced pass's Python signal; None when traced.
    untraced_python: int | None = None
    #: Calls of the measured code per run (iteration), when given: the leak per call.
    calls: int | None = None
    #: A native leak's largest groups of blocks still allocated after more runs under memray's
    #: native tracker: "function in /path/lib.so: +6.0 MiB in 6144 blocks (called from ...)".
    native_sites: tuple[str, ...] = ()
    #: The function and shared object that allocate most of the native leak ("leaky_keep_record
    #: in /path/libleaky.so"), or None when not named (see the notes).
    native_owner: str | None = None

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
    def leak_per_call(self) -> int | None:
        """:attr:`leak_per_iteration` divided by :attr:`calls`, or None when calls is unknown."""
        return None if self.calls is None else self.leak_per_iteration // self.calls

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
        if name in LEAK_KINDS and self.calls is not None:
            per_call = value // max(self.iterations, 1) // self.calls
            extra.append(f"{format_bytes(per_call)} per call, {self.calls} calls per run")
        if name == "python_leak" and self.python_owner() is not None:
            extra.append(f"allocated inside {self.python_owner()}")
        if name == "native_leak" and self.traced_growth is not None:
            extra.append(f"tracemalloc saw {format_bytes(max(self.traced_growth, 0))}")
        if name == "native_leak" and self.native_owner is not None:
            extra.append(f"allocated in {self.native_owner}")
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

    def python_owner(self) -> str | None:
        """The installed distribution that allocated most of the Python leak (its largest
        allocation site's owner, when that site holds at least half of the leak), or None."""
        if not self.top_sites or not self.python_leak:
            return None
        site = self.top_sites[0]
        return site.owner if site.size * 2 >= self.python_leak else None

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
        if self.native_owner is not None:
            tips["native_leak"] = (
                f"C code allocated without freeing: {self.native_owner} allocates the blocks"
                " that stay (see the native allocation sites); check that library's release"
                " notes and issue tracker, or the code that calls it."
            )
        owner = self.python_owner()
        if owner is not None:
            tips["python_leak"] = (
                f"The objects are allocated inside {owner}, called from the top site below: if"
                " your code keeps no reference to them, the leak is in that package (a refcount"
                " bug in a C extension, or its own cache); check its issue tracker or a newer"
                " release."
            )
        if self.arena_tops >= self.noise_floor and self.allocator == "glibc":
            tips["allocator_retention"] += (
                " Thread-arena tops are given back by a trim made in the thread that owns the"
                " arena, or bounded with memreclaim.glibc.set_arena_max()."
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
        if self.native_sites:
            lines.append("native allocation sites (blocks still allocated, memray):")
            lines.extend(f"  {site}" for site in self.native_sites)
        if self.top_sites:
            lines.append("top allocation sites (traced growth):")
            lines.extend(f"  {site}" for site in self.top_sites)
        for tip in self.advice():
            lines.append(f"next: {tip}")
        return "\n".join(lines)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # memreclaim/
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
    return tuple(_owned(site) for site in sites[:top])


def _owned(site: AllocationSite) -> AllocationSite:
    """``site`` with its owner (see :mod:`._attribute`), if it has one."""
    from ._attribute import owner

    found = owner(site.filename, site.lineno)
    return dataclasses.replace(site, owner=str(found)) if found is not None else site
