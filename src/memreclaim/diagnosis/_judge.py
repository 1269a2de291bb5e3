"""The diagnosis's rule: one judge per component, composed over a :class:`Context`.

A judge reads the context (the baseline, its jitter, one :class:`~._read.Point` per measured
iteration, what was read after the trim) and returns its finding as a frozen dataclass; it
records the series it judged, with its threshold, in the context. :func:`judge` runs them in
order -- Python, native heap, shared memory and mapped files, other threads (mimalloc 2),
outside malloc, threads, then the retention split -- and returns a :class:`Verdict`. No judge
reads the process: the unit tests drive them with synthetic series.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from .._core import TrimResult
from ..units import format_bytes
from ._read import Point

JITTER_FACTOR = 8  # a component's threshold is at least this many times its measured jitter
MARGIN_GLIBC = 0.06  # uncertainty of the malloc-side cost of traced allocations
MARGIN_OTHER = 0.25  # size classes of jemalloc/tcmalloc/mimalloc round more
FOOTPRINT_FACTOR = 4  # resident footprints (mimalloc): threshold at least 4x the noise floor


@dataclass(frozen=True)
class Calibration:
    """tracemalloc's hidden costs, measured once per process (bytes)."""

    per_trace: float  # allocator bytes per live trace that get_tracemalloc_memory() omits
    counted_per_trace: float  # bytes per trace entry that get_tracemalloc_memory() counts


@dataclass(frozen=True)
class After:
    """What was read after the diagnosis's trim."""

    trim: TrimResult | None  # what the trim returned
    anon: int | None  # anonymous RSS
    parts: dict[str, int] | None  # the allocator's in-use bytes per part
    owned: int | None  # what the allocator owns
    pymalloc: tuple[int, int] | None  # (arena bytes, allocated bytes)
    mapped: int | None = None  # mimalloc: resident bytes of its mappings
    arena_free: Callable[[], int] = lambda: 0  # glibc: free bytes in thread arenas (read late)
    pool_reclaimable: Callable[[], int | None] = lambda: None  # empty pymalloc pools' bytes


@dataclass
class Context:
    """Everything the judges read, and the series/thresholds/notes they record."""

    alloc: str
    base: Point
    jitter: Point
    points: list[Point]
    floor: int
    after: After
    iterations: int = 0  # measured runs (default: len(points))
    traced: bool = False
    cal: Calibration = Calibration(0.0, 16.0)
    shares: dict[str, float] | None = None  # traced growth's share per size part (small/large)
    own_peak: int = 0  # tracemalloc's own memory at its peak (the sampler)
    new_traces: int = 0  # live traces gained since the baseline
    series: dict[str, list[int]] = field(default_factory=dict)
    thresholds: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.iterations:
            self.iterations = max(len(self.points), 1)

    @property
    def end(self) -> Point:
        return self.points[-1]

    @property
    def margin(self) -> float:
        return MARGIN_GLIBC if self.alloc == "glibc" else MARGIN_OTHER

    @property
    def hidden(self) -> float:
        """Allocator bytes per byte tracemalloc counts of its own."""
        return 1 + self.cal.per_trace / self.cal.counted_per_trace

    def threshold(self, jitter: int | None) -> int:
        return max(self.floor, JITTER_FACTOR * (jitter or 0), 1)

    def record(self, name: str, values: list[int], threshold: int) -> tuple[int, int]:
        """Keep a series with its threshold and judge it: (steady, one-time)."""
        self.series[name] = values
        self.thresholds[name] = threshold
        return steady_growth(values, threshold)

    def python_in_malloc(self, p: Point) -> int:
        """Traced growth that lives in the C allocator (not in pymalloc's arenas)."""
        if p.traced is None or self.base.traced is None:
            return 0
        grown = p.traced - self.base.traced
        if p.pymalloc is not None and self.base.pymalloc is not None:
            grown -= max(p.pymalloc[1] - self.base.pymalloc[1], 0)
        return int(max(grown, 0) * (1 + self.margin))

    def own_growth(self, p: Point) -> int:
        """tracemalloc's own growth, with what it does not count."""
        return int(max(p.own - self.base.own, 0) * self.hidden)

    def arenas(self, pym: tuple[int, int] | None) -> int:
        """Growth of pymalloc's arenas since the baseline."""
        if pym is None or self.base.pymalloc is None:
            return 0
        return max(pym[0] - self.base.pymalloc[0], 0)


# ---- the series rule -----------------------------------------------------------------------


def slope(values: list[int]) -> float:
    """Least-squares slope of ``values`` per step."""
    n = len(values)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    my = sum(values) / n
    num = sum((i - mx) * (v - my) for i, v in enumerate(values))
    den = sum((i - mx) ** 2 for i in range(n))
    return num / den


def steady_growth(series: list[int], threshold: int) -> tuple[int, int]:
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
    rise = slope(tail) * n
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


def net_parts(
    p: Point,
    base: Point,
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


def clip(value: int | None) -> int:
    return max(value or 0, 0)


# ---- the judges ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Python:
    leak: int | None  # None without tracemalloc
    once: int = 0
    reason: str | None = None
    #: Without tracemalloc: steady growth of pymalloc's allocated blocks (small objects), the
    #: untraced pass's Python signal; None when traced or when pymalloc's figures are missing.
    untraced: int | None = None


def judge_python(ctx: Context) -> Python:
    """Python: bytes traced by tracemalloc."""
    base, points = ctx.base, ctx.points
    if ctx.traced and all(p.traced is not None for p in points) and base.traced is not None:
        values = [(p.traced or 0) - base.traced for p in points]
        leak, once = ctx.record("python", values, ctx.threshold(ctx.jitter.traced))
        return Python(leak, once)
    ctx.notes.append(
        "tracemalloc was off: Python and native growth cannot be told apart; "
        "'native leak' holds all allocator in-use growth"
    )
    steady: int | None = None
    once = 0
    if base.pymalloc is not None and all(p.pymalloc is not None for p in points):
        values = [(p.pymalloc or (0, 0))[1] - base.pymalloc[1] for p in points]
        steady, once = ctx.record("python (pymalloc blocks)", values, ctx.threshold(0))
    return Python(
        None,
        once,
        reason="tracemalloc was off (trace=False): Python objects are not told apart; those"
        " malloc'd (over 512 bytes) count in the native series, small ones in pymalloc's arenas",
        untraced=steady,
    )


@dataclass(frozen=True)
class Native:
    leak: int | None  # None when the allocator's in-use bytes cannot be read
    once: int = 0
    in_use_growth: int | None = None


def _net(ctx: Context, p: Point) -> dict[str, int]:
    python = ctx.python_in_malloc(p)
    return net_parts(p, ctx.base, python + ctx.own_growth(p), python, ctx.shares)


def _judge_part(
    ctx: Context, part: str, values: list[int], kept: dict[str, int] | None
) -> tuple[int, int]:
    """(steady, one-time) of one part of the allocator's in-use bytes."""
    name = f"native {part}" if len(ctx.base.parts or {}) > 1 else "native"
    limit = ctx.threshold((ctx.jitter.parts or {}).get(part))
    footprint = part.startswith("resident")
    if footprint:
        # A footprint moves with page acquisition: a coarser threshold, growth must go on in
        # the second half, and rise at least twice between iterations.
        limit = max(limit, FOOTPRINT_FACTOR * ctx.floor)
    steady, once = ctx.record(name, values, limit)
    late = values[-1] - values[(len(values) - 1) // 2]
    rises = sum(b - a >= limit / 4 for a, b in itertools.pairwise(values))
    if footprint and len(values) > 2 and (late < limit / 2 or rises < 2):
        steady, once = 0, once + steady
    if kept is not None and footprint:
        left = max(kept[part], 0)
        steady = min(steady, left) if min(steady, left) >= limit else 0
        once = min(once, max(left - steady, 0))
    return steady, once


def judge_native(ctx: Context) -> Native:
    """Native (malloc): each part of the allocator's in-use bytes on its own, then their sum:
    a leak whose blocks move between parts (the first one in a heap hole, the next ones
    mmapped) is steady in the sum though no part is."""
    base, points, end = ctx.base, ctx.points, ctx.end
    if base.parts is None or not all(p.parts is not None for p in points):
        return Native(None)
    in_use_growth = sum((end.parts or {}).values()) - sum(base.parts.values())
    nets = [_net(ctx, p) for p in points]
    kept = None
    if any(k.startswith("resident") for k in base.parts) and ctx.after.parts is not None:
        # Footprints (mimalloc), not bytes in use: what the trim gave back was free.
        kept = _net(ctx, dataclasses.replace(end, parts=ctx.after.parts, tcache=None))
    leak = once = 0
    for part in base.parts:
        steady, grown = _judge_part(ctx, part, [net[part] for net in nets], kept)
        leak += steady
        once += grown
    if len(base.parts) > 1 and kept is None:
        totals = [sum(net.values()) for net in nets]
        limit = ctx.threshold(sum((ctx.jitter.parts or {}).values()))
        steady, _ = steady_growth(totals, limit)
        if steady > leak:  # the parts' one-time growth was the leak's first blocks
            once = max(once - (steady - leak), 0)
            leak = steady
    if ctx.alloc == "mimalloc" and "small" in base.parts:
        ctx.notes.append(
            "mimalloc 2: native bytes are those of this thread's heap (with exited threads' heaps,"
            " taken in by a collect); a live thread's leak shows in mimalloc's mappings"
        )
    elif ctx.alloc == "mimalloc":
        ctx.notes.append(
            "mimalloc 3: its bytes in use cannot be read; the native figure is the resident"
            " memory of its mappings (all threads) that stays after the trim"
        )
    return Native(leak, once, in_use_growth)


@dataclass(frozen=True)
class Shared:
    shmem_leak: int = 0
    shmem_once: int = 0
    file_leak: int = 0


def judge_shared(ctx: Context) -> Shared:
    """Shared memory (RssShmem), and mapped files (RssFile): kept mappings of files a library
    maps per call. Code and data paged in once (a module's first use) is one-time growth, not
    live data: not counted. A single measured run cannot tell the two apart (the first run of a
    code path pages in 64 KiB windows of the interpreter and its libraries, more or fewer with
    where ASLR put them), so there the growth is a note, never a leak."""
    base, points, jit = ctx.base, ctx.points, ctx.jitter
    shmem_leak = shmem_once = file_leak = 0
    if base.shmem is not None and all(p.shmem is not None for p in points):
        values = [(p.shmem or 0) - base.shmem for p in points]
        shmem_leak, shmem_once = ctx.record("shared memory", values, ctx.threshold(jit.shmem))
    if base.file is not None and all(p.file is not None for p in points):
        values = [(p.file or 0) - base.file for p in points]
        file_leak, _ = ctx.record("mapped files", values, ctx.threshold(jit.file))
        if len(points) == 1 and file_leak:
            ctx.notes.append(
                f"mapped files grew {format_bytes(file_leak)} in one measured run: code and data "
                "paged in at first use cannot be told from files mapped and kept in one run, so "
                "it is not counted as a leak; measure(..., repeat=2 or more) judges mapped files"
            )
            file_leak = 0
    return Shared(shmem_leak, shmem_once, file_leak)


def other_threads_series(ctx: Context) -> list[int] | None:
    """mimalloc 2: growth of the resident bytes of mimalloc's mappings (every thread's heap),
    per point; None when not mimalloc 2 or a figure is missing."""
    base = ctx.base
    if ctx.alloc != "mimalloc" or "small" not in (base.parts or {}) or base.mapped is None:
        return None
    if not all(p.mapped is not None for p in ctx.points):
        return None
    return [(p.mapped or 0) - base.mapped for p in ctx.points]


def _outside(ctx: Context, p: Point, anon: int | None, owned: int | None) -> int:
    """Anonymous RSS growth at ``p`` that neither the allocator nor pymalloc's arenas own."""
    base = ctx.base
    # Without pymalloc's own figures (another allocator hook is installed), the traced growth
    # stands in for its arenas: Python objects are never memory outside malloc.
    if p.pymalloc is None or base.pymalloc is None:
        pymalloc = clip((p.traced or 0) - (base.traced or 0)) if base.traced is not None else 0
    else:
        pymalloc = ctx.arenas(p.pymalloc)
    # tracemalloc's own tables are malloc's too, but they may refill heap pages an earlier
    # trim gave back, which raises RSS and not the heap's size: never outside malloc. So may
    # any block: the allocator's resident growth is at least its in-use growth.
    tables = int(max(p.own - base.own, 0) * ctx.hidden)
    in_use = sum((p.parts or {}).values()) - sum((base.parts or {}).values())
    mine = max(clip((owned or 0) - (base.owned or 0)) + tables, in_use) + pymalloc
    return (anon or 0) - (base.anon or 0) - mine


@dataclass(frozen=True)
class Outside:
    private_leak: int | None  # None when the allocator's figures are unknown
    other_threads: int = 0  # native leak moved from outside malloc (mimalloc 2's other threads)


def judge_outside(ctx: Context, native: Native) -> Outside:
    """Outside malloc: anonymous RSS no allocator or arena owns, confirmed after the trim.
    Under mimalloc 2, the part of it that lies in mimalloc's mappings is another thread's
    native leak (confirmed after the trim: it stays there)."""
    base, after, end = ctx.base, ctx.after, ctx.end
    if base.owned is None or base.anon is None:
        return Outside(None)
    values = [_outside(ctx, p, p.anon, p.owned) for p in ctx.points]
    limit = ctx.threshold((ctx.jitter.anon or 0) + (ctx.jitter.owned or 0))
    private_leak, _ = ctx.record("outside malloc", values, limit)
    moved = 0
    others = other_threads_series(ctx) if native.leak is not None else None
    if others is not None and private_leak:
        ctx.series["native, other threads"] = others
        steady, _ = steady_growth(others, limit)
        mapped_after = clip((after.mapped or 0) - (base.mapped or 0))
        moved = min(steady, private_leak, mapped_after)
        if moved >= limit:
            private_leak -= moved
            ctx.notes.append(
                f"{format_bytes(moved)} grew in mimalloc's mappings outside this thread's"
                " heap: another thread's native leak"
            )
        else:
            moved = 0
    # Confirmed after the trim: memory the allocator gave back was not outside it.
    at_end = dataclasses.replace(end, parts=after.parts, pymalloc=after.pymalloc)
    left = _outside(ctx, at_end, after.anon, after.owned)
    private_leak = min(private_leak, max(left, 0))
    if private_leak < limit:
        private_leak = 0
    return Outside(private_leak, moved)


def judge_threads(ctx: Context) -> int:
    """Threads (evidence): growth since the baseline; a note when it is steady."""
    growth = ctx.end.threads - ctx.base.threads
    if growth > 0 and ctx.iterations > 1:
        steady, _ = steady_growth([p.threads - ctx.base.threads for p in ctx.points], 1)
        if steady:
            ctx.notes.append(f"{growth} more threads than at the baseline, more each iteration")
    return growth


@dataclass(frozen=True)
class Retention:
    """What stayed resident after the trim, split (bytes), and the raw figures around it."""

    released: int = 0  # given back by the trim, less tracemalloc's own freed tables
    arena_tops: int = 0  # held after the trim (glibc thread-arena tops, free lists)
    pymalloc: int = 0  # arenas kept by a few live small objects
    unreclaimed: int = 0  # pinned by live blocks, fragmentation
    tm_freed: int = 0  # tracemalloc's own freed tables the trim gave back
    anon_growth: int | None = None
    anon_after: int | None = None
    overhead: int = 0  # tracemalloc's own growth


def _live(ctx: Context, python: Python, native: Native, outside: Outside) -> int:
    """What is still live after the trim (bytes over the baseline)."""
    base, after, end = ctx.base, ctx.after, ctx.end
    traced_growth = None if end.traced is None or base.traced is None else end.traced - base.traced
    if after.parts is not None and base.parts is not None:
        # What the allocator holds in use and pymalloc's arenas, from their own figures.
        live = sum(after.parts.values()) - sum(base.parts.values()) + (outside.private_leak or 0)
        live += outside.other_threads
        live += ctx.arenas(after.pymalloc) if after.pymalloc is not None else clip(traced_growth)
        return live
    native_total = max(native.leak or 0, 0) + native.once
    return clip(traced_growth) + native_total + _overhead(ctx) + (outside.private_leak or 0)


def _overhead(ctx: Context) -> int:
    if ctx.traced:
        return max(
            ctx.end.own - ctx.base.own + int(ctx.new_traces * ctx.cal.per_trace),
            0,
        )
    return ctx.own_growth(ctx.end)


def judge_retention(ctx: Context, python: Python, native: Native, outside: Outside) -> Retention:
    """The retention split: what the trim gave back (allocator retention), what pymalloc's
    arenas keep, what the allocator still holds free, and what live blocks pin."""
    base, after, result = ctx.base, ctx.after, ctx.after.trim
    tm_freed = int(max(ctx.own_peak - ctx.end.own, 0) * ctx.hidden)
    trimmed = (result.released if result is not None else None) or 0
    released = max(trimmed - tm_freed, 0)
    anon_growth = anon_after = None
    if (
        base.anon is not None
        and result is not None
        and result.anon_before is not None
        and result.anon_after is not None
    ):
        anon_growth = result.anon_before - base.anon
        anon_after = result.anon_after - base.anon
    else:
        ctx.notes.append("anonymous RSS is unreadable (/proc): retention cannot be measured")
    live = _live(ctx, python, native, outside)
    pym_ret = 0
    if after.pymalloc is not None and base.pymalloc is not None:
        arena_growth = max(after.pymalloc[0] - base.pymalloc[0], 0)
        small_live = max(after.pymalloc[1] - base.pymalloc[1], 0)
        pym_ret = max(arena_growth - small_live, 0)
    rest = max((anon_after or 0) - live, 0)
    if after.parts is None or base.parts is None:
        pym_ret = min(pym_ret, rest)
        rest -= pym_ret
    arena_tops = 0
    if ctx.alloc == "glibc" and rest >= ctx.floor and after.parts is not None:
        arena_tops = min(after.arena_free(), rest)
        rest -= arena_tops
    elif after.parts is not None and after.owned is not None and base.parts is not None:
        # Free memory the allocator still holds after its purge (jemalloc/tcmalloc free lists,
        # mimalloc's committed free pages): retention, not pinned by live blocks.
        free_after = after.owned - sum(after.parts.values())
        free_base = (base.owned or 0) - sum(base.parts.values())
        arena_tops = min(clip(free_after - free_base), rest)
        rest -= arena_tops
    if tm_freed >= ctx.floor:
        ctx.notes.append(
            f"trim also gave back ~{format_bytes(min(tm_freed, trimmed))} of "
            "tracemalloc's own freed tables; not counted as allocator retention"
        )
    return Retention(
        released, arena_tops, pym_ret, rest, tm_freed, anon_growth, anon_after, _overhead(ctx)
    )


@dataclass(frozen=True)
class Verdict:
    """Every judge's finding."""

    python: Python
    native: Native
    shared: Shared
    outside: Outside
    thread_growth: int
    retention: Retention

    @property
    def native_leak(self) -> int | None:
        if self.native.leak is None:
            return None
        return self.native.leak + self.outside.other_threads

    @property
    def mapped_leak(self) -> int:
        """Outside malloc: private mappings, shared memory and mapped files. Shared memory is
        judged under every allocator; private mappings need the allocator's figures."""
        shared = self.shared
        return (self.outside.private_leak or 0) + shared.shmem_leak + shared.file_leak

    @property
    def one_time(self) -> int:
        """Live data kept once (caches). RSS that grew once outside malloc is retention."""
        return self.python.once + self.native.once + self.shared.shmem_once


def judge(ctx: Context) -> Verdict:
    """Every component's judge, in order, over ``ctx``."""
    python = judge_python(ctx)
    native = judge_native(ctx)
    shared = judge_shared(ctx)
    outside = judge_outside(ctx, native)
    threads = judge_threads(ctx)
    retention = judge_retention(ctx, python, native, outside)
    return Verdict(python, native, shared, outside, threads, retention)
