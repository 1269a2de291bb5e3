"""Benchmark: what each way of giving memory back leaves resident after a small-dict workload.

Workloads (each in a fresh interpreter, so nothing else shares the heap):
  dict-all       d = {i: {} for i in range(1_000_000)}; del d; gc.collect()
  dict-keep1000  the same, but every 1000th inner dict survives (1,000 live dicts)

Scenarios:
  default            nothing after gc.collect()
  malloc_trim        glibc malloc_trim(0) (memreclaim.trim() when the core is built)
  trim+pools         memreclaim.trim(pools=True) (pool reclaim enabled at start-up)
  PYTHONMALLOC=malloc+trim   pymalloc off, every object from glibc malloc, then malloc_trim(0)
  jemalloc / mimalloc / tcmalloc   LD_PRELOAD, then the allocator's own purge call

Every cell is the median of 3 runs. "floor" is the process's RSS right before the workload
(interpreter, imports): no method can go below it. Writes a markdown table to
docs/benchmarks/pools.md (or --out).

    python benchmarks/bench_pools.py [--runs 3] [--out docs/benchmarks/pools.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
PRELOADS = {
    "jemalloc": LIBDIR / "libjemalloc.so.2",
    "mimalloc": LIBDIR / "libmimalloc.so.2",
    "tcmalloc": LIBDIR / "libtcmalloc_minimal.so.4",
}

CHILD = textwrap.dedent(
    """
    import ctypes, gc, json, os, sys, time

    scenario, workload = sys.argv[1], sys.argv[2]

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    libc = ctypes.CDLL(None)

    def have(name):
        try:
            getattr(libc, name)
            return True
        except AttributeError:
            return False

    try:
        import memreclaim
        core_trim = getattr(memreclaim, "trim", None)
    except Exception:
        core_trim = None

    def trim():
        if core_trim is not None:
            core_trim()
            return "memreclaim.trim()"
        libc.malloc_trim(0)
        return "malloc_trim(0)"

    def purge_preloaded():
        if have("mallctl"):  # jemalloc
            libc.mallctl(b"arena.4096.purge", None, None, None, ctypes.c_size_t(0))
            return "mallctl arena.4096.purge"
        if have("mi_collect"):  # mimalloc
            libc.mi_collect(ctypes.c_bool(True))
            return "mi_collect(true)"
        if have("MallocExtension_ReleaseFreeMemory"):  # tcmalloc
            libc.MallocExtension_ReleaseFreeMemory()
            return "MallocExtension_ReleaseFreeMemory()"
        return "none"

    extra = {}
    if scenario.startswith("trim+pools"):
        from memreclaim import pools
        t0 = time.perf_counter_ns()
        pools.enable_pool_reclaim()
        extra["enable_ns"] = time.perf_counter_ns() - t0

    floor = rss()
    d = {i: {} for i in range(1_000_000)}
    keep = [d[i] for i in range(0, 1_000_000, 1000)] if workload == "dict-keep1000" else []
    peak = rss()
    del d
    gc.collect()
    after_gc = rss()

    how = "none"
    if scenario in ("malloc_trim", "PYTHONMALLOC=malloc+trim"):
        how = trim()
    elif scenario == "trim+pools":
        trim()
        r = memreclaim.trim(pools=True)
        st = pools.pool_reclaim_status()
        extra.update(pools_released=r.pools_released, bytes_released=r.pools_bytes,
                     arenas_skipped=st["arenas_skipped"], reclaim_ns=st["last_reclaim_ns"],
                     max_hold_ns=st["max_hold_ns"], arenas_tracked=st["arenas_tracked"])
        how = "memreclaim.trim() + memreclaim.trim(pools=True)"
    elif scenario in ("jemalloc", "mimalloc", "tcmalloc"):
        how = purge_preloaded()
    final = rss()
    assert all(k == {} for k in keep)
    print("RESULT " + json.dumps(dict(floor=floor, peak=peak, after_gc=after_gc, final=final,
                                      how=how, **extra)))
    """
)

SCENARIOS = [
    "default",
    "malloc_trim",
    "trim+pools",
    "PYTHONMALLOC=malloc+trim",
    "jemalloc",
    "mimalloc",
    "tcmalloc",
]
WORKLOADS = ["dict-all", "dict-keep1000"]

# The longest GIL hold of a full pass, seen by another thread: it sleeps 1 ms in a loop and
# records how late each wake-up is (a wake-up needs the GIL). Measured while trim(pools=True)
# runs, and over the same time with no reclaim (the machine's own noise).
HOLD_CHILD = textwrap.dedent(
    """
    import gc, json, os, sys, threading, time
    import memreclaim
    from memreclaim import pools

    n = int(sys.argv[1])
    pools.enable_pool_reclaim()
    d = {i: {} for i in range(n)}
    keep = [d[i] for i in range(0, n, 1000)]
    del d
    gc.collect()
    memreclaim.trim()

    def watch(until):
        gaps = []
        def ticker():
            last = time.perf_counter()
            while not until.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last - 0.001)
                last = now
        t = threading.Thread(target=ticker)
        t.start()
        return t, gaps

    stop = threading.Event()
    t, gaps = watch(until=stop)
    time.sleep(0.05)
    t0 = time.perf_counter()
    r = memreclaim.trim(pools=True)
    elapsed = time.perf_counter() - t0
    time.sleep(0.01)
    stop.set()
    t.join()
    quiet = threading.Event()
    t, idle_gaps = watch(until=quiet)
    time.sleep(elapsed + 0.06)
    quiet.set()
    t.join()
    st = pools.pool_reclaim_status()
    assert all(k == {} for k in keep)
    print("RESULT " + json.dumps(dict(max_gap=max(gaps), idle_gap=max(idle_gaps),
                                      elapsed=elapsed, max_hold_ns=st["max_hold_ns"],
                                      max_hold_cpu_ns=st["max_hold_cpu_ns"],
                                      released=r.pools_released, load=os.getloadavg()[0])))
    """
)
HOLD_SIZES = [1_000_000, 4_000_000]


def hold_once(n: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", HOLD_CHILD, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"GIL hold at {n} failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, float] = json.loads(lines[-1][len("RESULT ") :])
    return result


def hold_table(runs: int) -> list[str]:
    """The GIL-hold rows: 1M and 4M dicts interleaved (1M, 4M, 1M, 4M, ...), so both sizes see
    the same machine load; each row gives the median and the worst of ``runs`` processes, and a
    last line the 4M/1M ratios of the medians."""
    results: dict[int, list[dict[str, float]]] = {n: [] for n in HOLD_SIZES}
    for _ in range(runs):
        for n in HOLD_SIZES:
            results[n].append(hold_once(n))
            print(n, json.dumps(results[n][-1]), file=sys.stderr, flush=True)

    def ms(values: list[float], scale: float) -> str:
        return f"{statistics.median(values) * scale:.1f} ({max(values) * scale:.1f})"

    rows = []
    for n in HOLD_SIZES:
        rs = results[n]
        loads = [r["load"] for r in rs]
        rows.append(
            f"| {n:,} | {statistics.median(r['elapsed'] for r in rs) * 1e3:.0f} ms "
            f"| {ms([r['max_hold_ns'] for r in rs], 1e-6)} "
            f"| {ms([r['max_hold_cpu_ns'] for r in rs], 1e-6)} "
            f"| {ms([r['max_gap'] for r in rs], 1e3)} "
            f"| {ms([r['idle_gap'] for r in rs], 1e3)} "
            f"| {statistics.median(r['released'] for r in rs):.0f} "
            f"| {min(loads):.1f}-{max(loads):.1f} |"
        )
    small, large = (results[n] for n in HOLD_SIZES)

    def ratio(key: str) -> str:
        a = statistics.median(r[key] for r in small)
        b = statistics.median(r[key] for r in large)
        return f"{b / a:.2f}" if a else "-"

    rows += [
        "",
        f"Ratio {HOLD_SIZES[1]:,} / {HOLD_SIZES[0]:,} dicts (medians): longest hold "
        f"{ratio('max_hold_ns')} wall, {ratio('max_hold_cpu_ns')} CPU; longest wake-up gap "
        f"{ratio('max_gap')} (idle gap {ratio('idle_gap')}).",
    ]
    return rows


HOLD_HEADER = [
    "| dicts | pass | longest hold, wall (ms) | longest hold, CPU (ms) "
    "| longest wake-up gap (ms) | idle gap (ms) | pools | load (1 min) |",
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]


def run_once(scenario: str, workload: str) -> dict[str, object] | None:
    env = dict(os.environ)
    env.pop("PYTHONMALLOC", None)
    env.pop("LD_PRELOAD", None)
    if scenario == "PYTHONMALLOC=malloc+trim":
        env["PYTHONMALLOC"] = "malloc"
    if scenario in PRELOADS:
        if not PRELOADS[scenario].exists():
            return None
        env["LD_PRELOAD"] = str(PRELOADS[scenario])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, scenario, workload],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{scenario}/{workload} failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
    return result


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def median_of(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]


def glibc_version() -> str:
    try:
        return "glibc " + str(os.confstr("CS_GNU_LIBC_VERSION")).split()[-1]
    except (ValueError, OSError, IndexError):
        return "libc unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--no-hold", dest="hold", action="store_false", help="skip the GIL-hold measurement"
    )
    parser.add_argument(
        "--hold-only", action="store_true", help="only the GIL-hold measurement (printed)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "pools.md")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated subset, e.g. 'trim+pools,PYTHONMALLOC=malloc+trim' (the twin)",
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    workloads = args.workloads.split(",")
    unknown = sorted(set(scenarios) - set(SCENARIOS)) + sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown scenario or workload: {', '.join(unknown)}")
    if args.hold_only:
        print("\n".join([*HOLD_HEADER, *hold_table(args.runs)]))
        return

    rows = []
    for workload in workloads:
        for scenario in scenarios:
            runs = [run_once(scenario, workload) for _ in range(args.runs)]
            if any(r is None for r in runs):
                rows.append((workload, scenario, None))
                continue
            done = [r for r in runs if r is not None]
            rows.append((workload, scenario, done))
            print(
                f"{workload:14} {scenario:26} final {mib(median_of(done, 'final'))} MiB",
                file=sys.stderr,
            )

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Pool reclaim benchmark",
        "",
        f"Generated by `python benchmarks/bench_pools.py {' '.join(sys.argv[1:])}` on {now}:",
        f"CPython {platform.python_version()}, {glibc_version()}, "
        f"Linux {platform.release()}, {os.cpu_count()} CPUs. "
        f"Median of {args.runs} fresh processes per cell; RSS in MiB.",
        "",
        "`floor` is the RSS just before the workload (interpreter and imports): the page floor "
        "no method can go below. `peak` is with the 1M dicts alive; `after gc` after `del` and "
        "`gc.collect()`; `final` after the scenario's give-back call.",
        "",
        "| workload | scenario | floor | peak | after gc | final | final - floor "
        "| give-back call |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    details = []
    for workload, scenario, runs in rows:
        if runs is None:
            out.append(f"| {workload} | {scenario} | - | - | - | - | - | not installed |")
            continue
        floor = median_of(runs, "floor")
        final = median_of(runs, "final")
        out.append(
            f"| {workload} | {scenario} | {mib(floor)} | {mib(median_of(runs, 'peak'))} | "
            f"{mib(median_of(runs, 'after_gc'))} | **{mib(final)}** | {mib(final - floor)} | "
            f"{runs[0]['how']} |"
        )
        if scenario == "trim+pools":
            details.append(
                f"- {workload}: {median_of(runs, 'pools_released'):.0f} pools released "
                f"({mib(median_of(runs, 'bytes_released'))} MiB madvised, "
                f"{median_of(runs, 'arenas_skipped'):.0f} arenas skipped); the pass took "
                f"{median_of(runs, 'reclaim_ns') / 1e6:.1f} ms, its longest GIL hold "
                f"{median_of(runs, 'max_hold_ns') / 1e6:.1f} ms; enable() with its forked "
                f"self-test took {median_of(runs, 'enable_ns') / 1e6:.1f} ms. Header pages kept "
                f"(the first page of each released pool, resident): "
                f"{median_of(runs, 'pools_released'):.0f} x 4 KiB = "
                f"{mib(median_of(runs, 'pools_released') * 4096)} MiB."
            )
    out += ["", "Pool reclaim cost (median):", "", *details, ""]
    if args.hold:
        load = os.getloadavg()
        out += [
            "## GIL hold during a full pass",
            "",
            "Another thread sleeps 1 ms in a loop; its longest late wake-up while "
            "`trim(pools=True)` runs is the longest time it waited for the GIL. `idle` is the same "
            "thread over the same time with nothing running (the machine's noise). "
            f"{args.runs} fresh processes per size; load average before: "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs (`load` "
            "column: the 1-minute load average at the end of each process).",
            "",
            "Cells: median (worst) of the runs; 1M and 4M dicts alternate, one fresh process each.",
            "",
            *HOLD_HEADER,
            *hold_table(args.runs),
        ]
    out.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()
