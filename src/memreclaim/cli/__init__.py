"""Command line: ``python -m memreclaim`` (also the ``memreclaim`` console script).

Subcommands:

``demo``     reproduce a load spike in this process and show where the memory went;
``stats``    this interpreter's memory figures (``--json`` for machines);
``inspect``  another process's RSS breakdown from /proc/PID;
``run``      run a Python program with a periodic trimmer and report at exit.

Expected failures (a missing PID, a missing script, matplotlib not installed) print one line on
stderr and exit with status 1; bad arguments exit with status 2 and argparse's usage message.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import os
import platform
import runpy
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO, TypeVar

import memreclaim
from memreclaim import _validate, workloads
from memreclaim.units import format_bytes

__all__ = ["main"]

MiB = 1 << 20
_T = TypeVar("_T")
_NO_MATPLOTLIB = (
    "--plot needs matplotlib: pip install 'memreclaim[plot]' (or pip install matplotlib)"
)


class CliError(Exception):
    """An expected failure: printed as one line on stderr, exit status 1, no traceback."""


# --------------------------------------------------------------------------------------------
# progress on stderr: a step that ends within a second prints nothing


@dataclass
class Step:
    """One timed step: ``seconds`` is set when it ends (the body may set it first, to report
    a more precise figure of its own, e.g. the trim's own duration)."""

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
                if step.seconds is None:
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
            if step.seconds is None:
                step.seconds = time.perf_counter() - start
            if shown.is_set():
                print(f"  {label}: done in {_duration(step.seconds)}", file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    """A duration as the demo prints it everywhere: ``1.2 s`` or ``35.0 ms``."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


# --------------------------------------------------------------------------------------------
# demo: measurements


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
    """Everything ``demo`` measured; ``--json`` prints it as a dict."""

    workload: str
    description: str
    python: str
    allocator: str
    allocator_version: str | None
    traced: bool
    phases: list[Phase]
    build_seconds: float
    trim_seconds: float
    trim_released: int | None
    trim_method: str
    verdict: str
    verdict_text: str
    samples: list[tuple[float, int]] = field(default_factory=list)


class Recorder:
    """Takes a :class:`Phase` at each mark; optionally samples RSS over time for the plot."""

    def __init__(self, trace: bool, progress: Progress, sample_every: float | None) -> None:
        self.trace = trace
        self.progress = progress
        self.phases: list[Phase] = []
        self.samples: list[tuple[float, int]] = []
        self.build_seconds = 0.0  # the workload's build step, as its progress line shows it
        self.build_label = ""
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
        while not self._stop.wait(every):
            self.samples.append((time.perf_counter() - self.start, memreclaim.rss()))

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
        traced = tracemalloc.get_traced_memory()[0] if self.trace else None
        own = tracemalloc.get_tracemalloc_memory() if self.trace else None
        rss = memreclaim.rss()
        now = time.perf_counter() - self.start
        self.samples.append((now, rss))
        return Phase(name, now, rss, anon, traced, own, sys.getallocatedblocks(), in_use, free)

    def mark(self, name: str) -> Phase:
        """Record the figures now as phase ``name``."""
        phase = self.measure(name)
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
# demo: workloads. Each builds its spike, marks "peak", frees, marks "after free", and returns
# what must stay alive (the survivors) until the demo has trimmed and measured again.


def _spike(rec: Recorder, scale: float) -> object:
    """A burst of requests: strings of 600-4,000 bytes (malloc's, not pymalloc's), keep every
    50th (:func:`memreclaim.workloads.strings`)."""
    count = max(1000, int(160_000 * scale))
    with rec.progress.step(f"building {count:,} strings of 600-4,000 bytes") as step:
        data = workloads.strings(count)
    rec.build_seconds, rec.build_label = step.seconds or 0.0, step.label
    rec.mark("peak")
    survivors = workloads.keep_every(data, 50)
    del data
    gc.collect()
    rec.mark("after free")
    return survivors


def _buffers(rec: Recorder, scale: float) -> object:
    """Rounds of 1-5 MiB buffers with small objects between them; each round's last three
    buffers stay alive for three rounds; one small string per buffer survives
    (:func:`memreclaim.workloads.buffers`)."""
    rounds = max(2, int(20 * scale))

    def after_round(_: int) -> None:
        gc.collect()
        rec.mark_max("peak")

    with rec.progress.step(f"{rounds} rounds of 12 buffers of 1-5 MiB") as step:
        survivors = workloads.buffers(rounds, live_rounds=3, after_round=after_round)
    rec.build_seconds, rec.build_label = step.seconds or 0.0, step.label
    gc.collect()
    rec.mark("after free")
    return survivors


def _dicts(rec: Recorder, scale: float) -> object:
    """A dict of a million small dicts (pymalloc's), keep every 1000th inner dict
    (:func:`memreclaim.workloads.dicts`)."""
    count = max(10_000, int(1_000_000 * scale))
    with rec.progress.step(f"building a dict of {count:,} dicts") as step:
        outer = workloads.dicts(count)
    rec.build_seconds, rec.build_label = step.seconds or 0.0, step.label
    rec.mark("peak")
    survivors = workloads.keep_every(list(outer.values()), 1000)
    outer.clear()
    del outer
    gc.collect()
    rec.mark("after free")
    return survivors


# name -> (function, description, trace by default). The dicts workload is not traced by
# default: tracemalloc's bookkeeping for a million objects (~180 MiB here) dwarfs the effect.
WORKLOADS: dict[str, tuple[Callable[[Recorder, float], object], str, bool]] = {
    "spike": (
        _spike,
        "a burst of 160,000 strings of 600-4,000 bytes, every 50th kept",
        True,
    ),
    "buffers": (
        _buffers,
        "20 rounds of 12 buffers of 1-5 MiB with small strings between them, 3 buffers per"
        " round kept for 3 rounds, one string per buffer kept",
        True,
    ),
    "dicts": (
        _dicts,
        "a dict of 1,000,000 empty dicts, every 1000th kept",
        False,
    ),
}


def demo_verdict(phases: Sequence[Phase]) -> tuple[str, str]:
    """Judge a spike from the demo's own phases: ``(code, sentence)``.

    The one place the rule lives (to be swapped for ``memreclaim.diagnose()`` later). With
    *growth* the RSS rise from baseline to peak, *held* what is still resident after the free,
    and *back* what the trim then gave back:

    - ``no-spike``: growth below 8 MiB, nothing to judge;
    - ``returned``: held is under a quarter of growth: freeing already gave it back;
    - ``live``: objects are still allocated: traced memory above baseline is more than half of
      held (without tracing: more than half of the spike's Python blocks are still allocated),
      so it is a leak or a cache and trimming cannot help;
    - ``retained``: back is at least half of held: retained by the allocator, not leaked;
    - ``pinned``: not live, yet back is under half of held: free memory that is not returned,
      because a few survivors keep its pages (or pymalloc arenas) in use, or because the
      allocator's policy keeps it (mimalloc 2.0.9's decommit delay).
    """
    by_name = {p.name: p for p in phases}
    base, peak = by_name["baseline"], by_name["peak"]
    freed, trimmed = by_name["after free"], by_name["after trim"]
    growth = peak.rss - base.rss
    held = freed.rss - base.rss
    back = freed.rss - trimmed.rss
    if growth < 8 * MiB:
        return "no-spike", f"no spike to judge: RSS grew only {format_bytes(growth)}"
    if held < growth / 4:
        return "returned", "returned to the OS when freed: nothing retained"
    if base.traced is not None and freed.traced is not None:
        live = freed.traced - base.traced
        if live > held / 2:
            return "live", (
                f"held by live objects: traced memory is still {format_bytes(live)} above"
                " baseline; a leak or a cache, trimming cannot help"
            )
    elif freed.blocks - base.blocks > (peak.blocks - base.blocks) / 2:
        return "live", (
            f"held by live objects: {freed.blocks - base.blocks:,} of the spike's"
            f" {peak.blocks - base.blocks:,} Python blocks are still allocated; a leak or a cache,"
            " trimming cannot help"
        )
    if back >= held / 2:
        return "retained", (
            f"retained by the allocator, not leaked: {format_bytes(held)} above baseline was"
            f" still resident after the free, and trim gave back {format_bytes(back)}"
        )
    return "pinned", (
        f"retained, not leaked, but trim gave back only {format_bytes(max(back, 0))} of"
        f" {format_bytes(held)}: survivors scattered over pages or pymalloc arenas pin the free"
        " memory, or the allocator's own policy keeps it"
    )


def run_demo(
    workload: str, *, trace: bool | None, scale: float, progress: Progress, sample: bool
) -> DemoResult:
    """Run one workload in this process and return what was measured.

    ``trace=None`` traces with tracemalloc when the workload does by default.
    """
    build, description, trace_default = WORKLOADS[workload]
    if trace is None:
        trace = trace_default
    gc.collect()
    if trace:
        tracemalloc.start()
    rec = Recorder(trace, progress, 0.01 if sample else None)
    try:
        rec.mark("baseline")
        survivors = build(rec, scale)
        with progress.step("trimming") as step:
            result = memreclaim.trim()
            step.seconds = result.seconds  # the figure the summary prints too
        rec.mark("after trim")
        del survivors
    finally:
        rec.close()
        if trace:
            tracemalloc.stop()
    code, text = demo_verdict(rec.phases)
    return DemoResult(
        workload=workload,
        description=description
        if scale == 1.0
        else f"{description}, scaled by {scale:g}: {rec.build_label.removeprefix('building ')}",
        python=platform.python_version(),
        allocator=memreclaim.allocator(),
        allocator_version=memreclaim.allocator_version(),
        traced=trace,
        phases=rec.phases,
        build_seconds=rec.build_seconds,
        trim_seconds=result.seconds,
        trim_released=result.released,
        trim_method=result.method,
        verdict=code,
        verdict_text=text,
        samples=rec.samples if sample else [],
    )


def _size(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def format_demo(result: DemoResult) -> str:
    """The demo's table and verdict as text."""
    version = f" {result.allocator_version}" if result.allocator_version else ""
    lines = [
        f"memreclaim demo: {result.description}",
        f"Python {result.python}, allocator {result.allocator}{version}",
        "",
        f"{'phase':<11} {'RSS':>10} {'traced':>10} {'tracemalloc':>11} {'alloc in use':>12}"
        f" {'alloc free':>10}",
    ]
    for p in result.phases:
        lines.append(
            f"{p.name:<11} {_size(p.rss):>10} {_size(p.traced):>10} {_size(p.tracemalloc):>11}"
            f" {_size(p.heap_in_use):>12} {_size(p.heap_free):>10}"
        )
    lines.append("")
    lines.append(
        f"build took {_duration(result.build_seconds)}; {result.trim_method} took"
        f" {_duration(result.trim_seconds)} and released {_size(result.trim_released)}"
        " (anonymous RSS)"
    )
    if result.traced:
        lines.append(
            "traced: live Python allocations (tracemalloc); tracemalloc: its own bookkeeping,"
            " part of RSS. Tracing slows the build; --no-trace for the untraced figures."
        )
    else:
        lines.append(
            "tracing off (--trace to turn it on): the verdict counts sys.getallocatedblocks()"
            " instead of traced bytes"
        )
    lines.append(
        "alloc in use / free: the allocator's own figures (heap_stats(); mallinfo2 on glibc)"
    )
    lines.append("")
    lines.append(f"verdict: {result.verdict_text}")
    return "\n".join(lines)


def plot_demo(result: DemoResult, path: str) -> None:
    """Draw RSS over time with the phases marked, into the PNG ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError(_NO_MATPLOTLIB) from None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    times = [t for t, _ in result.samples]
    ax.plot(times, [r / MiB for _, r in result.samples], color="tab:blue", label="RSS")
    for p in result.phases:
        ax.axvline(p.seconds, color="grey", linewidth=0.6, linestyle=":")
        ax.annotate(
            f"{p.name}\n{p.rss / MiB:.0f} MiB",
            (p.seconds, p.rss / MiB),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    if result.traced:
        ax.plot(
            [p.seconds for p in result.phases],
            [(p.traced or 0) / MiB for p in result.phases],
            color="tab:orange",
            marker="o",
            linestyle="none",
            label="traced (tracemalloc) at each phase",
        )
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, max(p.rss for p in result.phases) / MiB * 1.2)
    ax.set_title(f"memreclaim demo '{result.workload}' ({result.allocator}): {result.verdict}")
    ax.legend(loc="center left")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: reproduce a spike, print the table (or JSON), optionally plot it."""
    # fail before the work, and without importing matplotlib into the measured process
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise CliError(_NO_MATPLOTLIB)
    progress = Progress(enabled=not args.json)
    result = run_demo(
        args.workload,
        trace=args.trace,
        scale=args.scale,
        progress=progress,
        sample=args.plot is not None,
    )
    if args.plot is not None:
        plot_demo(result, args.plot)
    if args.json:
        data = asdict(result)
        del data["samples"]
        print(json.dumps(data, indent=2))
    else:
        print(format_demo(result))
        if args.plot is not None:
            print(f"plot written to {args.plot}")
    return 0


# --------------------------------------------------------------------------------------------
# stats


def cmd_remote(args: argparse.Namespace) -> int:
    """``trim --pid`` / ``stats --pid``: run the command inside another process."""
    from memreclaim import remote

    try:
        answer = remote.request(
            args.pid,
            args.command,
            pools=getattr(args, "pools", False),
            timeout=getattr(args, "timeout", 30.0),
            method=getattr(args, "method", "auto"),
        )
    except (OSError, remote.RemoteError) as exc:
        raise CliError(str(exc)) from None
    if "error" in answer:
        raise CliError(f"process {args.pid}: {answer['error']}")
    if args.command == "trim" and answer["result"]["method"] == "none":
        if args.json:
            print(json.dumps(answer, indent=2))
        raise CliError(
            f"process {args.pid}: its allocator was not detected"
            f" ({answer['result']['allocator']}): nothing was trimmed"
        )
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.command == "trim":
        r = answer["result"]
        released = "unknown" if r["released"] is None else format_bytes(r["released"])
        print(
            f"pid {args.pid} ({answer['via']}): released {released}"
            f" ({r['allocator']} {r['method']}, {r['seconds'] * 1000:.1f} ms)"
        )
    else:
        for key, value in answer["result"].items():
            print(f"{key:16} {value}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """``stats``: this interpreter's memory figures."""
    if getattr(args, "pid", None) is not None:
        return cmd_remote(args)
    try:
        st = memreclaim.stats(heap=True)
    except memreclaim.UnsupportedAllocatorError:  # an allocator without statistics
        st = memreclaim.stats()
    heap = st.heap
    data: dict[str, Any] = {
        "pid": os.getpid(),
        "python": platform.python_version(),
        "allocator": st.allocator,
        "allocator_version": memreclaim.allocator_version(),
        "rss": st.rss,
        "rss_anon": st.rss_anon,
        "rss_file": st.rss_file,
        "rss_shmem": st.rss_shmem,
        "peak_rss": st.peak_rss,
        "swap": st.swap,
        "traced_current": st.traced_current,
        "traced_peak": st.traced_peak,
        "heap": None
        if heap is None
        else {
            "in_use": heap.in_use,
            "free": heap.free,
            "mapped": heap.mapped,
            "figures": heap.figures,
        },
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    version = f" {data['allocator_version']}" if data["allocator_version"] else ""
    print(f"pid {data['pid']}, Python {data['python']}, allocator {st.allocator}{version}")
    for key in ("rss", "rss_anon", "rss_file", "rss_shmem", "peak_rss", "swap"):
        print(f"  {key:<16} {_size(data[key])}")
    if heap is not None:
        print(f"  {'heap in use':<16} {_size(heap.in_use)}")
        print(f"  {'heap free':<16} {_size(heap.free)}")
        print(f"  {'heap mapped':<16} {_size(heap.mapped)}")
    return 0


# --------------------------------------------------------------------------------------------
# inspect PID


_STATUS_FIELDS = {
    "VmRSS": "rss",
    "RssAnon": "rss_anon",
    "RssFile": "rss_file",
    "RssShmem": "rss_shmem",
    "VmSwap": "swap",
    "VmHWM": "peak_rss",
    "VmSize": "virtual",
}
_ROLLUP_FIELDS = {
    "Pss": "pss",
    "Private_Dirty": "private_dirty",
    "Shared_Clean": "shared_clean",
    "Anonymous": "anonymous",
    "AnonHugePages": "anon_huge_pages",
}


def _read_proc(pid: int, name: str) -> str:
    path = f"/proc/{pid}/{name}"
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}"):
            raise CliError(f"no process with PID {pid}") from None
        raise
    except PermissionError:
        raise CliError(
            f"permission denied reading {path}: it needs ptrace access (the process's own"
            " user, or root with CAP_SYS_PTRACE)"
        ) from None
    except ProcessLookupError:  # the process exited while we read
        raise CliError(f"no process with PID {pid}") from None


def _kib_fields(text: str, wanted: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[wanted[key]] = int(parts[0]) * 1024
    return out


def inspect_pid(pid: int) -> dict[str, Any]:
    """RSS breakdown of process ``pid`` from /proc: status, smaps_rollup and the [heap] mapping.

    Raises:
        CliError: no such process, or /proc/PID/status is not readable.
    """
    status = _read_proc(pid, "status")
    name = ""
    threads = None
    for line in status.splitlines():
        if line.startswith("Name:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    data: dict[str, Any] = {"pid": pid, "name": name, "threads": threads}
    data.update({v: None for v in _STATUS_FIELDS.values()})
    data.update(_kib_fields(status, _STATUS_FIELDS))
    data.update({v: None for v in _ROLLUP_FIELDS.values()})
    notes: list[str] = []
    try:
        data.update(_kib_fields(_read_proc(pid, "smaps_rollup"), _ROLLUP_FIELDS))
    except CliError as exc:
        notes.append(f"smaps_rollup: {exc}")
    except OSError as exc:  # e.g. kernels without smaps_rollup (before 4.14)
        notes.append(f"smaps_rollup: {exc.strerror or exc}")
    heap = None
    try:
        for line in _read_proc(pid, "maps").splitlines():
            if line.endswith("[heap]"):
                start, end = line.split()[0].split("-")
                heap = (heap or 0) + int(end, 16) - int(start, 16)
    except CliError as exc:
        notes.append(f"maps: {exc}")
    data["heap_mapping"] = heap
    data["notes"] = notes
    return data


def cmd_inspect(args: argparse.Namespace) -> int:
    """``inspect PID``: another process's RSS breakdown."""
    data = inspect_pid(args.pid)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"pid {data['pid']} ({data['name']}), {data['threads']} thread(s)")
    rows = [
        ("rss", "resident"),
        ("rss_anon", "  anonymous"),
        ("rss_file", "  file-backed"),
        ("rss_shmem", "  shared memory"),
        ("swap", "swapped out"),
        ("peak_rss", "peak resident (VmHWM)"),
        ("pss", "proportional (Pss)"),
        ("private_dirty", "private dirty"),
        ("heap_mapping", "[heap] mapping (brk)"),
        ("virtual", "virtual size"),
    ]
    for key, label in rows:
        print(f"  {label:<24} {_size(data[key]):>11}")
    for note in data["notes"]:
        print(f"  note: {note}")
    return 0


# --------------------------------------------------------------------------------------------
# run: a program with a periodic trimmer


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``run``: execute a script or module in this process with the trimmer running."""
    from memreclaim.watchdog import BackgroundTrimmer  # the policy layer, only when needed

    try:
        trimmer = BackgroundTrimmer(
            interval=args.interval, slack=args.slack, min_interval=args.min_interval
        )
    except (TypeError, ValueError) as exc:  # e.g. a min interval past the back-off cap
        parser.error(f"run: {exc}")
    argv: list[str] = args.argv
    if args.module is None:
        if not argv:
            parser.error("run: give a script (run -- script.py args) or a module (run -m mod)")
        script = argv[0]
        if not os.path.isfile(script):
            raise CliError(f"cannot run {script!r}: no such file")
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    else:
        sys.argv = [args.module, *argv]
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(args.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise CliError(f"no module named {args.module!r}")
    trimmer.start()
    start = time.perf_counter()
    status: int = 0
    try:
        if args.module is None:
            runpy.run_path(sys.argv[0], run_name="__main__")
        else:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    finally:
        trimmer.stop()
        elapsed = time.perf_counter() - start
        st = memreclaim.stats()
        done = trimmer.counters
        print(
            f"memreclaim run: {elapsed:.1f} s, peak RSS {_size(st.peak_rss)}, RSS now"
            f" {_size(st.rss)}; {done.trims} trim(s) released {format_bytes(done.bytes_released)}"
            f" in {done.trim_seconds * 1000:.1f} ms (interval {args.interval:g} s, slack"
            f" {format_bytes(args.slack)}, min interval {args.min_interval:g} s)",
            file=sys.stderr,
        )
    return status


# --------------------------------------------------------------------------------------------
# argument parsing


def _argument(
    convert: Callable[[str], Any], check: Callable[[str, Any], _T], name: str
) -> Callable[[str], _T]:
    """An argparse ``type``: ``convert`` the text, then ``check(name, value)`` it with
    :mod:`memreclaim._validate`, so the command line accepts what the API accepts."""

    def parse(text: str) -> _T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        try:
            return check(name, value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _scale(name: str, value: float) -> float:
    if not (0 < value < float("inf")):  # a factor, not seconds or bytes: none of _validate's
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value


_positive_float = _argument(float, _scale, "value")
_seconds_arg = _argument(float, _validate.seconds, "value")
_size_arg = _argument(str, _validate.size, "value")
_pid_arg = _argument(int, functools.partial(_validate.integer, minimum=1), "PID")


def build_parser() -> argparse.ArgumentParser:
    """The ``memreclaim`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="memreclaim",
        description="Give freed memory back to the OS, and tell allocator retention from leaks.",
    )
    parser.add_argument("--version", action="version", version=memreclaim.__version__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="reproduce a load spike here and show where the memory went",
        description="Reproduce a load spike in this process: baseline, peak, after free, after"
        " trim, and a verdict.",
    )
    demo.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="spike",
        help="spike: a burst of 160,000 strings, every 50th kept (default); buffers: rounds of"
        " 1-5 MiB buffers; dicts: a dict of a million dicts",
    )
    demo.add_argument("--json", action="store_true", help="print the measurements as JSON")
    demo.add_argument("--plot", metavar="FILE.png", help="draw RSS over time (needs matplotlib)")
    demo.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run tracemalloc for the traced column (default: on, except for dicts where its"
        " bookkeeping would dwarf the effect); it slows the build several times",
    )
    demo.add_argument(
        "--scale",
        type=_positive_float,
        default=1.0,
        help="multiply the workload's size by this factor (default 1)",
    )

    stats = sub.add_parser("stats", help="this interpreter's memory figures")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument(
        "--pid", type=_pid_arg, help="another Python process's figures (see trim --pid)"
    )

    trim = sub.add_parser(
        "trim",
        help="trim a running Python process from outside (sys.remote_exec or its handler)",
        description="Trim process PID: through sys.remote_exec when this command runs on"
        " Python 3.14+, else through the handler the process installed with"
        " memreclaim.install_signal_handler(). See docs/containers.md.",
    )
    trim.add_argument("--pid", type=_pid_arg, required=True, help="the process to trim")
    trim.add_argument("--pools", action="store_true", help="also reclaim empty pymalloc pools")
    trim.add_argument(
        "--method", choices=("auto", "remote_exec", "signal"), default="auto", help="(auto)"
    )
    trim.add_argument(
        "--timeout", type=_positive_float, default=30.0, help="seconds to wait for it (30)"
    )
    trim.add_argument("--json", action="store_true", help="print JSON")

    insp = sub.add_parser("inspect", help="RSS breakdown of another process from /proc")
    insp.add_argument("pid", type=_pid_arg, metavar="PID")
    insp.add_argument("--json", action="store_true", help="print JSON")

    run = sub.add_parser(
        "run",
        help="run a Python program with a periodic trimmer, report at exit",
        usage="memreclaim run [--interval S] [--slack SIZE] [--min-interval S]"
        " (-m MODULE | [--] SCRIPT) [ARGS...]",
    )
    run.add_argument(
        "--interval", type=_seconds_arg, default=1.0, help="seconds between checks (1)"
    )
    run.add_argument(
        "--slack",
        type=_size_arg,
        default=64 * MiB,
        help="trim when RSS exceeds its floor by more than this (default 64 MiB)",
    )
    run.add_argument(
        "--min-interval",
        type=_seconds_arg,
        default=10.0,
        help="seconds between two trims at least (default 10)",
    )
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGS")
    return parser


def _split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``run [options] (-m MODULE | [--] SCRIPT) ARGS`` into (our options, the program's).

    Everything after the module name or the script belongs to the program, ``--help`` included,
    as with ``python -m module --help``; argparse alone would take such options for ``run``.
    """
    if not argv or argv[0] != "run":
        return argv, []
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1 :]
        if token == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if token.startswith("-m") and not token.startswith("--"):  # -mmodule, like python
            return argv[: i + 1], argv[i + 1 :]
        if token in ("--interval", "--slack", "--min-interval"):
            i += 2
        elif token.startswith("-"):
            i += 1  # --interval=S, -h, or a mistake that argparse will report
        else:
            return argv[:i], argv[i:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m memreclaim`` and the ``memreclaim`` script; returns the status.

    A reader that leaves early (``memreclaim stats | head -1``) ends the command quietly with
    status 141 (as if killed by SIGPIPE, like other command-line tools), whenever the write
    happens: stdout is flushed here, not at interpreter exit where the error would be reported
    as "Exception ignored" and status 120.
    """
    try:
        try:
            status = _main(argv)
        except SystemExit:  # --help, --version and usage errors print, then exit
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 141


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    options, program = _split_run(argv)
    args = parser.parse_args(options)
    if args.command == "run":
        args.argv = program
    try:
        if args.command == "demo":
            return cmd_demo(args)
        if args.command == "stats":
            return cmd_stats(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        if args.command == "trim":
            return cmd_remote(args)
        return cmd_run(args, parser)
    except CliError as exc:
        print(f"memreclaim {args.command}: {exc}", file=sys.stderr)
        return 1
    except memreclaim.UnsupportedAllocatorError as exc:
        print(f"memreclaim {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
