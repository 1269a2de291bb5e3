"""Loop-stall benchmark: how much does giving memory back delay an asyncio event loop?

Every scenario runs in a fresh interpreter on the same fragmented heap (the seed-000 shape:
160,000 strings of 600-4,000 bytes from random.Random(0), every 50th kept, ~370 MiB retained),
while a probe task times 1 ms sleeps; its *lateness* is how much longer an iteration took than
1 ms. Scenarios, side by side in one run:

  on-loop            trim() called on the event loop
  thread-noalloc     await trim_async(); the probe allocates nothing
  thread-alloc2k     await trim_async(); the probe allocates four 2 KiB objects per iteration
  load-baseline      request-like load with idle gaps (requests allocate 2 KiB objects; the
                     probe does not allocate), no trim at all
  load-thread-naive  the same load, trim_async() at a fixed time, ignoring the load
  load-watchdog      the same load, Watchdog(idle_gating=True) trims when it sees the loop idle
  never-idle         a loop that never idles (requests back to back): the watchdog trims at
                     its deadline; this is the honest bound
  tick-cost          the watchdog's CPU cost per tick (see below)

Lateness "during the trim" counts probe iterations that overlap the trim's [start, end].

    python benchmarks/bench_loop_stall.py                  # ~2 minutes, prints the table
    python benchmarks/bench_loop_stall.py --write docs/benchmarks/loop-stall.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from typing import Any

import memreclaim
import memreclaim.watchdog as watchdog_module
from memreclaim import workloads

MiB = 2**20
PROBE_PERIOD = 0.001
ALLOC_SIZE = 2048  # read at run time: not a constant expression CPython could fold


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Probe:
    """Times PROBE_PERIOD sleeps; optionally allocates `count` objects of `size` bytes each."""

    def __init__(self, size: int, count: int = 4) -> None:
        self.size = size
        self.count = count
        self.samples: list[tuple[float, float, float]] = []  # (start, end, lateness)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        size = self.size
        count = self.count
        sink: list[bytes] = []
        while not self.stop.is_set():
            start = time.perf_counter()
            if size:
                sink = [b"p" * size for _ in range(count)]
            await asyncio.sleep(PROBE_PERIOD)
            end = time.perf_counter()
            self.samples.append((start, end, end - start - PROBE_PERIOD))
        del sink


class Load:
    """Request-like load: bursts of short requests (2 KiB allocations, 0.2 ms of CPU per step,
    8 steps), then idle gaps; or, with gaps=False, requests back to back forever."""

    def __init__(self, seed: int, gaps: bool) -> None:
        self.rng = random.Random(seed)
        self.gaps = gaps
        self.stop = asyncio.Event()
        self.requests = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def request(self) -> None:
        size = ALLOC_SIZE
        for _ in range(8):
            body = [b"r" * size for _ in range(4)]
            spin(0.0002)
            await asyncio.sleep(0)
        del body
        self.requests += 1

    def spawn(self) -> None:
        task = asyncio.get_running_loop().create_task(self.request())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        rng = self.rng
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            burst_end = loop.time() + (rng.uniform(0.05, 0.15) if self.gaps else 3600.0)
            while loop.time() < burst_end and not self.stop.is_set():
                self.spawn()
                await asyncio.sleep(rng.expovariate(1 / 0.004) if self.gaps else 0)
            if self.gaps:
                await asyncio.sleep(rng.uniform(0.15, 0.4))
        await asyncio.gather(*self.tasks)


def instrument_trim(windows: list[tuple[float, float]]) -> None:
    """Record [start, end] of every trim the watchdog makes (in its thread).

    The runners call the public ``memreclaim.trim``; :func:`scenario` checks that every trim
    the watchdog counted was recorded here, so a runner that stops calling it fails the run
    instead of leaving its rows without trims.
    """
    original = memreclaim.trim

    def timed(*, pools: bool = False) -> memreclaim.TrimResult:
        start = time.perf_counter()
        try:
            return original(pools=pools)
        finally:
            windows.append((start, time.perf_counter()))

    memreclaim.trim = timed


def summarise(probe: Probe, windows: list[tuple[float, float]], settle: float) -> dict[str, Any]:
    lateness = [late for _, _, late in probe.samples]
    during: list[float] = []
    outside: list[float] = []
    for start, end, late in probe.samples:
        overlaps = any(start <= w_end and end >= w_start for w_start, w_end in windows)
        (during if overlaps else outside).append(late)
    lateness.sort()
    outside.sort()
    return {
        "worst_outside_ms": outside[-1] * 1000 if outside else None,
        "p99_outside_ms": outside[int(0.99 * (len(outside) - 1))] * 1000 if outside else None,
        "iterations": len(lateness),
        "worst_ms": lateness[-1] * 1000 if lateness else None,
        "p99_ms": lateness[int(0.99 * (len(lateness) - 1))] * 1000 if lateness else None,
        "worst_during_trim_ms": max(during) * 1000 if during else None,
        "trim_ms": [round((end - start) * 1000, 1) for start, end in windows],
        "settle_s": settle,
    }


async def scenario(name: str, seed: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    windows: list[tuple[float, float]] = []
    base = memreclaim.rss()
    result: dict[str, Any] = {"scenario": name, "seed": seed}

    if name == "tick-cost":
        return await tick_cost()

    watchdog = None
    if name in ("load-watchdog", "never-idle"):
        instrument_trim(windows)
        watchdog = watchdog_module.Watchdog(
            interval=0.1,
            slack="64 MiB",
            min_interval=1.0,
            idle_gating=True,
            idle_deadline=1.0,
        )
        watchdog.start()
        await asyncio.sleep(0.25)

    kept = workloads.spike()
    retained = memreclaim.rss()
    result["heap_mib"] = round((retained - base) / MiB, 1)

    # Under load, the requests allocate 2 KiB objects and the probe only measures the loop's
    # responsiveness (an allocating probe would itself be "work" running during any trim).
    allocating = name in ("on-loop", "thread-alloc2k")
    probe = Probe(ALLOC_SIZE if allocating else 0)
    probe_task = loop.create_task(probe.run())
    load = None
    if name.startswith("load-") or name == "never-idle":
        load = Load(seed, gaps=name != "never-idle")
        load_task = loop.create_task(load.run())
    await asyncio.sleep(0.3)

    released = 0
    if name == "on-loop":
        start = time.perf_counter()
        outcome = memreclaim.trim()
        windows.append((start, time.perf_counter()))
        released = outcome.released or 0
        await asyncio.sleep(0.2)
    elif name in ("thread-noalloc", "thread-alloc2k", "load-thread-naive"):
        start = time.perf_counter()
        outcome = await memreclaim.trim_async()
        windows.append((start, time.perf_counter()))
        released = outcome.released or 0
        await asyncio.sleep(0.2 if name != "load-thread-naive" else 1.5)
    elif name == "load-baseline":
        await asyncio.sleep(1.5)
    elif watchdog is not None:
        for _ in range(100):  # up to ~5 s
            if watchdog.counters.trims:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        counters = watchdog.counters
        if counters.trims != len(windows):
            raise RuntimeError(
                f"the watchdog counted {counters.trims} trim(s) but {len(windows)} went through"
                " memreclaim.trim: the instrument missed them"
            )
        released = counters.bytes_released
        result["watchdog"] = {
            "trims": counters.trims,
            "deadline_trims": counters.deadline_trims,
            "skipped_busy": counters.skipped_busy,
            "skipped_rising": counters.skipped_rising,
        }
        await watchdog.stop()

    probe.stop.set()
    if load is not None:
        load.stop.set()
        await load_task
        result["requests"] = load.requests
    await probe_task
    result.update(summarise(probe, windows, 0.0))
    result["released_mib"] = round(released / MiB, 1)
    result["rss_after_mib"] = round(memreclaim.rss() / MiB, 1)
    del kept
    return result


async def tick_cost() -> dict[str, Any]:
    """CPU per tick: (a) a watchdog at 1 s interval for 10 s in an otherwise idle process;
    (b) 5,000 ticks at 1 ms against a bare 1 ms sleep loop (marginal cost of the policy)."""
    result: dict[str, Any] = {"scenario": "tick-cost"}
    watchdog = watchdog_module.Watchdog(interval=1.0)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    watchdog.start()
    await asyncio.sleep(10.05)
    await watchdog.stop()
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    ticks = watchdog.counters.ticks
    result["interval_1s"] = {
        "ticks": ticks,
        "cpu_ms": round(cpu * 1000, 3),
        "cpu_per_tick_us": round(cpu / max(ticks, 1) * 1e6, 1),
        "core_fraction_pct": round(cpu / wall * 100, 4),
        "tick_body_us": round(watchdog.counters.tick_seconds / max(ticks, 1) * 1e6, 1),
    }

    async def bare(n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(0.001)

    n = 5000
    cpu0 = time.process_time()
    await bare(n)
    bare_cpu = time.process_time() - cpu0
    fast = watchdog_module.Watchdog(interval=0.001)
    cpu0 = time.process_time()
    fast.start()
    while fast.counters.ticks < n:
        await asyncio.sleep(0.05)
    await fast.stop()
    fast_cpu = time.process_time() - cpu0
    ticks = fast.counters.ticks
    per_tick = fast_cpu / ticks
    result["interval_1ms"] = {
        "ticks": ticks,
        "cpu_per_tick_us": round(per_tick * 1e6, 1),
        "bare_sleep_cpu_per_iteration_us": round(bare_cpu / n * 1e6, 1),
        "marginal_cpu_per_tick_us": round((per_tick - bare_cpu / n) * 1e6, 1),
        "at_1s_interval_pct_of_core": round(per_tick * 100, 4),
    }
    return result


SCENARIOS = [
    "on-loop",
    "thread-noalloc",
    "thread-alloc2k",
    "load-baseline",
    "load-thread-naive",
    "load-watchdog",
    "never-idle",
]


def run_child(name: str, seed: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, "--seed", str(seed)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout}\n{proc.stderr}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def max_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return max(values) if values else None


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| scenario | runs | trim (ms) | worst lateness during the trim (ms): median [max] "
        "| runs with that <= 5 ms | outside the trim, same runs: p99 / worst (ms), median "
        "| released (MiB) | vs one trim on the loop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    reference = statistics.median(r["released_mib"] for r in results["on-loop"])
    for name in SCENARIOS:
        runs = results[name]
        during = [r["worst_during_trim_ms"] for r in runs if r["worst_during_trim_ms"] is not None]
        trims = [ms for r in runs for ms in r["trim_ms"]]
        released = statistics.median(r["released_mib"] for r in runs)
        within = f"{sum(1 for d in during if d <= 5.0)}/{len(during)}" if during else "-"
        lines.append(
            f"| {name} | {len(runs)} | {fmt(statistics.median(trims)) if trims else '-'} "
            f"| {fmt(median_of(runs, 'worst_during_trim_ms'))} "
            f"[{fmt(max_of(runs, 'worst_during_trim_ms'))}] | {within} "
            f"| {fmt(median_of(runs, 'p99_outside_ms'))} / "
            f"{fmt(median_of(runs, 'worst_outside_ms'))} "
            f"| {released:.1f} | {released / reference * 100:.0f}% |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=5, help="runs of each scenario")
    parser.add_argument("--load-runs", type=int, default=10, help="runs of the load scenarios")
    parser.add_argument("--write", help="write the markdown report to this path")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(scenario(args.child, args.seed))))
        return

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SCENARIOS}
    for run in range(max(args.runs, args.load_runs)):
        for name in SCENARIOS:  # interleaved, so machine noise hits every scenario alike
            limit = args.load_runs if name.startswith("load-") else args.runs
            if run < limit:
                results[name].append(run_child(name, seed=run))
    cost = run_child("tick-cost", 0)

    glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "?"
    command = "python benchmarks/bench_loop_stall.py " + " ".join(
        a for a in sys.argv[1:] if not a.startswith("--write") and a != args.write
    )
    header = [
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"Python {platform.python_version()}; {glibc}; allocator {memreclaim.allocator()}; "
        f"{os.cpu_count()} CPUs (shared with other work while this ran).",
        "",
        f"Command: `{command.strip()}`",
        "",
    ]
    lines = header + table(results)
    lines += ["", "Watchdog counters per run (load-watchdog, never-idle):", ""]
    for name in ("load-watchdog", "never-idle"):
        for r in results[name]:
            lines.append(
                f"- {name} seed {r['seed']}: {r.get('watchdog')}, during-trim worst "
                f"{fmt(r['worst_during_trim_ms'])} ms, trim {r['trim_ms']} ms, released "
                f"{r['released_mib']} MiB, requests {r.get('requests')}"
            )
    lines += ["", "Tick cost:", "", "```", json.dumps(cost, indent=2), "```"]
    text = "\n".join(lines)
    print(text)
    if args.write:
        raw = json.dumps({"results": results, "tick_cost": cost}, indent=1)
        with open(args.write + ".json", "w") as handle:
            handle.write(raw)
        with open(args.write + ".table", "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
