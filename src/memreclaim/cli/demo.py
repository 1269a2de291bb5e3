"""``demo``: reproduce a load spike in this process, show where the memory went, and judge it
with the diagnosis engine (:func:`memreclaim.diagnose`), the one the pytest plugin uses.

The workload runs as two bursts under the engine's repeat mode: a snapshot, a burst, a
checkpoint, a second burst, a checkpoint, then :func:`memreclaim.diagnose` (which trims). Each
burst keeps a few survivors alive until the next burst replaces them: the survivors are live on
purpose (they are what pins freed memory), and two bursts let the engine see that they do not
grow, so it calls them one-time growth instead of a leak. ``--leak`` keeps every burst's
survivors instead: they pile up, and the engine says leak.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import platform
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import memreclaim
from memreclaim import workloads

from . import plot
from ._common import show_size

BURSTS = 2  # the fewest with which the engine can tell bounded survivors from a leak
# The engine's noise floor for the demo: its spikes are hundreds of MiB, and with two bursts a
# component that differs by half the floor from one burst to the next would count as steady.
NOISE_FLOOR = "1 MiB"

# --------------------------------------------------------------------------------------------
# progress on stderr: a step that ends within a second prints nothing


@dataclass
class Step:
    """One timed step: ``seconds`` is set when it ends."""

    label: str
    seconds: float | None = None


class Progress:
    """Print ``step...`` on stderr for steps that take longer than ``delay`` seconds."""

    def __init__(self, enabled: bool, stream: TextIO | None = None, delay: float = 1.0) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay

    @contextmanager
    def step(self, label: str) -> Iterator[Step]:
        """Context manager around one step; announces it only once it has run ``delay`` s.

        Yields a :class:`Step` whose ``seconds`` holds the step's duration once it ends, the
        figure the progress line shows (so a summary can print the same one).
        """
        step = Step(label)
        start = time.perf_counter()
        if not self.enabled:
            try:
                yield step
            finally:
                step.seconds = time.perf_counter() - start
            return
        shown = threading.Event()

        def announce() -> None:
            shown.set()
            print(f"  {label}...", file=self.stream, flush=True)

        timer = threading.Timer(self.delay, announce)
        timer.daemon = True
        timer.start()
        try:
            yield step
        finally:
            timer.cancel()
            step.seconds = time.perf_counter() - start
            if shown.is_set():
                print(f"  {label}: done in {duration(step.seconds)}", file=self.stream, flush=True)


def duration(seconds: float) -> str:
    """A duration as the demo prints it everywhere: ``1.2 s`` or ``35.0 ms``."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


# --------------------------------------------------------------------------------------------
# measurements


@dataclass
class Phase:
    """Memory figures at one point of the demo; sizes in bytes, ``None`` when not available."""

    name: str
    seconds: float
    rss: int
    rss_anon: int | None
    traced: int | None
    tracemalloc: int | None
    blocks: int
    heap_in_use: int | None
    heap_free: int | None


@dataclass
class DemoResult:
    """Everything ``demo`` measured; ``--json`` prints it as a dict (without ``samples``)."""

    workload: str
    description: str
    python: str
    allocator: str
    allocator_version: str | None
    traced: bool
    bursts: int
    leak: bool
    phases: list[Phase]
    build_seconds: float  # all the bursts, as the progress line and the summary show it
    trim_method: str | None  # what the diagnosis's trim called, e.g. "malloc_trim(0)"
    trim_seconds: float | None
    trim_released: int | None
    verdict: str  # leak, retained, pinned, returned or clean
    verdict_text: str
    diagnosis: dict[str, Any]
    notes: list[str]
    report: str
    samples: list[tuple[float, int]] = field(default_factory=list)


class Recorder:
    """Takes a :class:`Phase` at each mark; optionally samples RSS over time for the plot."""

    # Samples go into arrays allocated up front (10 minutes at 10 ms): sampling allocates
    # nothing while the engine measures, so the plot cannot pass for Python growth.
    CAPACITY = 60_000

    def __init__(self, trace: bool, sample_every: float | None) -> None:
        self.trace = trace
        self.phases: list[Phase] = []
        size = self.CAPACITY if sample_every is not None else 0
        self._times = array.array("d", bytes(8 * size))
        self._rss = array.array("q", bytes(8 * size))
        self._count = 0
        self.start = time.perf_counter()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        if sample_every is not None:
            self._sampler = threading.Thread(
                target=self._sample,
                args=(sample_every,),
                name="memreclaim-demo-sampler",
                daemon=True,
            )
            self._sampler.start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every) and self._count < len(self._times):
            self._times[self._count] = time.perf_counter() - self.start
            self._rss[self._count] = memreclaim.rss()
            self._count += 1

    def samples(self) -> list[tuple[float, int]]:
        """RSS over time: the sampler's readings and the phases' (call once sampling stopped)."""
        taken = zip(self._times[: self._count], self._rss[: self._count], strict=True)
        return sorted([*taken, *((p.seconds, p.rss) for p in self.phases)])

    def close(self) -> None:
        """Stop the sampler thread, if any."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()

    def measure(self, name: str) -> Phase:
        """Return the figures now, without recording them."""
        anon = memreclaim.stats().rss_anon
        try:
            heap = memreclaim.heap_stats()  # walks the heap on glibc: fine here, not a hot path
            in_use, free = heap.in_use, heap.free
        except memreclaim.UnsupportedAllocatorError:
            in_use = free = None
        tracing = self.trace and tracemalloc.is_tracing()
        traced = tracemalloc.get_traced_memory()[0] if tracing else None
        own = tracemalloc.get_tracemalloc_memory() if tracing else None
        rss = memreclaim.rss()
        now = time.perf_counter() - self.start
        return Phase(name, now, rss, anon, traced, own, sys.getallocatedblocks(), in_use, free)

    def mark(self, name: str) -> Phase:
        """Record the figures now as phase ``name`` (replacing an earlier one of that name:
        "after free" is the last burst's)."""
        phase = self.measure(name)
        self.phases = [p for p in self.phases if p.name != name]
        self.phases.append(phase)
        return phase

    def mark_max(self, name: str) -> None:
        """Record phase ``name`` as the highest figures seen over repeated calls.

        For workloads measured round by round: each figure keeps its own maximum (RSS, traced,
        allocated blocks ...), and ``seconds`` is the time of the highest RSS.
        """
        new = self.measure(name)
        for i, old in enumerate(self.phases):
            if old.name == name:
                self.phases[i] = Phase(
                    name,
                    new.seconds if new.rss > old.rss else old.seconds,
                    max(new.rss, old.rss),
                    _max(new.rss_anon, old.rss_anon),
                    _max(new.traced, old.traced),
                    _max(new.tracemalloc, old.tracemalloc),
                    max(new.blocks, old.blocks),
                    _max(new.heap_in_use, old.heap_in_use),
                    _max(new.heap_free, old.heap_free),
                )
                return
        self.phases.append(new)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


# --------------------------------------------------------------------------------------------
# workloads: one burst each. A burst builds its spike, marks "peak", frees all but its
# survivors, marks "after free", and returns the survivors.


def _spike(rec: Recorder, scale: float) -> object:
    """A burst of requests: strings of 600-4,000 bytes (malloc's, not pymalloc's), keep every
    50th (:func:`memreclaim.workloads.strings`)."""
    data = workloads.strings(_spike_count(scale))
    rec.mark_max("peak")
    survivors = workloads.keep_every(data, 50)
    del data
    gc.collect()
    rec.mark("after free")
    return survivors


def _spike_count(scale: float) -> int:
    return max(1000, int(160_000 * scale))


def _buffers(rec: Recorder, scale: float) -> object:
    """Rounds of 1-5 MiB buffers with small objects between them; each round's last three
    buffers stay alive for three rounds; one small string per buffer survives
    (:func:`memreclaim.workloads.buffers`)."""

    def after_round(_: int) -> None:
        gc.collect()
        rec.mark_max("peak")

    survivors = workloads.buffers(_buffer_rounds(scale), live_rounds=3, after_round=after_round)
    gc.collect()
    rec.mark("after free")
    return survivors


def _buffer_rounds(scale: float) -> int:
    return max(2, int(20 * scale))


def _dicts(rec: Recorder, scale: float) -> object:
    """A dict of a million small dicts (pymalloc's), keep every 1000th inner dict
    (:func:`memreclaim.workloads.dicts`)."""
    outer = workloads.dicts(_dict_count(scale))
    rec.mark_max("peak")
    survivors = workloads.keep_every(list(outer.values()), 1000)
    outer.clear()
    del outer
    gc.collect()
    rec.mark("after free")
    return survivors


def _dict_count(scale: float) -> int:
    return max(10_000, int(1_000_000 * scale))


@dataclass(frozen=True)
class Workload:
    """A demo workload: one ``burst``, what one burst is (for a given scale), and whether it
    is traced by default."""

    burst: Callable[[Recorder, float], object]
    what: Callable[[float], str]
    trace: bool


# The dicts workload is not traced by default: tracemalloc's bookkeeping for a million objects
# (~145 MiB more peak RSS here) dwarfs the effect. Nor is buffers: traced, the shape retains
# nothing (glibc 2.36: 18.2 MiB after the free against a 17.5 MiB baseline, untraced 68.1
# against 16.5), so the demo would not show what seed 004 is about.
WORKLOADS: dict[str, Workload] = {
    "spike": Workload(
        _spike,
        lambda s: f"{_spike_count(s):,} strings of 600-4,000 bytes, every 50th kept",
        True,
    ),
    "buffers": Workload(
        _buffers,
        lambda s: (
            f"{_buffer_rounds(s)} rounds of 12 buffers of 1-5 MiB with small strings"
            " between them, 3 buffers per round kept for 3 rounds, one string per buffer kept"
        ),
        False,
    ),
    "dicts": Workload(
        _dicts,
        lambda s: f"a dict of {_dict_count(s):,} empty dicts, every 1000th kept",
        False,
    ),
}

# The report's kind -> the demo's verdict code and its headline.
_HEADLINES = {
    "leak": "leaked",
    "retained": "retained by the allocator, not leaked",
    "pinned": "held, not leaked: a few live survivors pin freed memory that trim cannot return",
    "returned": "not leaked, and mostly returned to the OS when freed",
    "clean": "returned to the OS when freed: nothing above the noise floor stayed",
}


def verdict_of(report: memreclaim.Report) -> tuple[str, str]:
    """The demo's verdict from the engine's report: ``(code, sentence)``.

    ``leak`` when the report finds any leak (leaks come first in its verdict), else by the
    largest finding: ``retained`` (allocator retention: trim gave it back), ``pinned``
    (pymalloc retention, or heap pages live blocks keep), ``returned`` (the survivors' one-time
    growth is the largest part: freeing gave the rest back), ``clean`` (nothing above the noise
    floor stayed).
    The sentence is the headline, then the engine's own verdict line.
    """
    kind = report.kind
    if report.leaks():
        code = "leak"
    elif kind == "allocator_retention":
        code = "retained"
    elif kind in ("pymalloc_retention", "unreclaimed_retention"):
        code = "pinned"
    elif kind == "one_time":
        code = "returned"
    else:
        code = "clean"
    return code, f"{_HEADLINES[code]}: {report.verdict}"


def run_demo(
    workload: str,
    *,
    trace: bool | None,
    scale: float,
    progress: Progress,
    sample: bool,
    leak: bool = False,
) -> DemoResult:
    """Run ``BURSTS`` bursts of one workload in this process, judge them with
    :func:`memreclaim.diagnose`, and return what was measured.

    ``trace=None`` traces with tracemalloc when the workload does by default. ``leak`` keeps
    every burst's survivors (they pile up: a leak) instead of only the last burst's.
    """
    spec = WORKLOADS[workload]
    if trace is None:
        trace = spec.trace
    what = spec.what(scale)
    started_tracing = trace and not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start()  # ours, not the snapshot's: "after trim" is read while it still runs
    rec = Recorder(trace, 0.01 if sample else None)
    kept: list[object] = []
    try:
        before = memreclaim.snapshot(trace=trace)  # collects, trims, reads the baseline
        rec.mark("baseline")
        with progress.step(f"{BURSTS} bursts of {what}") as step:
            try:
                for _ in range(BURSTS):
                    if not leak:
                        kept.clear()  # the survivors live until the next burst starts
                    survivors = spec.burst(rec, scale)
                    kept.append(survivors)
                    del survivors
                    before.checkpoint()
            except BaseException:
                before.close()
                raise
        report = memreclaim.diagnose(before, noise_floor=NOISE_FLOOR)  # trims once, judges
        rec.mark("after trim")
        kept.clear()
    finally:
        rec.close()
        if started_tracing:
            tracemalloc.stop()
    code, text = verdict_of(report)
    return DemoResult(
        workload=workload,
        description=what,
        python=platform.python_version(),
        allocator=memreclaim.allocator(),
        allocator_version=memreclaim.allocator_version(),
        traced=trace,
        bursts=BURSTS,
        leak=leak,
        phases=rec.phases,
        build_seconds=step.seconds or 0.0,
        trim_method=report.trim.method if report.trim is not None else None,
        trim_seconds=report.trim.seconds if report.trim is not None else None,
        trim_released=report.trim.released if report.trim is not None else None,
        verdict=code,
        verdict_text=text,
        diagnosis={"kind": report.kind, **report.significant()},
        notes=list(report.notes),
        report=report.format(),
        samples=rec.samples() if sample else [],
    )


def format_demo(result: DemoResult) -> str:
    """The demo's table and verdict as text."""
    version = f" {result.allocator_version}" if result.allocator_version else ""
    kept = ", every burst's to the end (--leak)" if result.leak else " until the next burst starts"
    lines = [
        f"memreclaim demo: {result.bursts} bursts of {result.description}{kept}",
        f"Python {result.python}, allocator {result.allocator}{version}",
        "",
        f"{'phase':<11} {'RSS':>10} {'traced':>10} {'tracemalloc':>11} {'alloc in use':>12}"
        f" {'alloc free':>10}",
    ]
    for p in result.phases:
        lines.append(
            f"{p.name:<11} {show_size(p.rss):>10} {show_size(p.traced):>10}"
            f" {show_size(p.tracemalloc):>11} {show_size(p.heap_in_use):>12}"
            f" {show_size(p.heap_free):>10}"
        )
    lines.append("")
    trim = "the diagnosis trimmed"
    if result.trim_method is not None:
        trim += f" ({result.trim_method})"
    if result.trim_seconds is not None:
        trim += (
            f" in {duration(result.trim_seconds)}, and anonymous RSS fell by"
            f" {show_size(result.trim_released)}"
        )
    lines.append(f"the {result.bursts} bursts took {duration(result.build_seconds)}; {trim}")
    lines.append(
        "peak: the highest figures of the bursts; after free: the last burst's, with its"
        " survivors alive"
    )
    if result.traced:
        lines.append(
            "traced: live Python allocations (tracemalloc); tracemalloc: its own bookkeeping,"
            " part of RSS. Tracing slows the bursts; --no-trace for the untraced figures."
        )
    else:
        lines.append(
            "tracing off (--trace to turn it on): Python and native growth are judged together"
        )
    lines.append(
        "alloc in use / free: the allocator's own figures (heap_stats(); mallinfo2 on glibc,"
        " whose free bytes still count the free chunks whose pages trim gave back)"
    )
    if not result.leak:
        lines.append(
            "survivors: live until the next burst starts; the engine sees they do not pile up"
            " and counts them as one-time growth, not as a leak"
        )
    lines.append("")
    headline = _HEADLINES[result.verdict]
    lines.append(f"verdict: {headline}")
    lines.append(f"  found: {result.verdict_text[len(headline) + 2 :]}")
    lines.extend(f"  note: {note}" for note in result.notes)
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: reproduce a spike, print the table (or JSON), optionally plot it."""
    if args.plot is not None:
        plot.check_available()  # before the work, without importing matplotlib here
    progress = Progress(enabled=not args.json)
    result = run_demo(
        args.workload,
        trace=args.trace,
        scale=args.scale,
        progress=progress,
        sample=args.plot is not None,
        leak=args.leak,
    )
    if args.plot is not None:
        plot.plot_demo(result, args.plot)
    if args.json:
        data = memreclaim.asdict(result)
        del data["samples"]
        print(json.dumps(data, indent=2))
    else:
        print(format_demo(result))
        if args.report:
            print()
            print(result.report)
        if args.plot is not None:
            print(f"plot written to {args.plot}")
    return 0
