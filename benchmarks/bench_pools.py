"""Benchmark: what each way of giving memory back leaves resident after a small-dict workload.

Workloads (each in a fresh interpreter, so nothing else shares the heap):
  dict-all       d = {i: {} for i in range(1_000_000)}; del d; gc.collect()
  dict-keep1000  the same, but every 1000th inner dict survives (1,000 live dicts)

Scenarios:
  default            nothing after gc.collect()
  malloc_trim        glibc malloc_trim(0) (memreclaim.trim() when the core is built)
  trim+pools         memreclaim pool reclaim (enabled at start-up), then malloc_trim(0)
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
        r = pools.reclaim_pools()
        # the budgeted form: the worst single call with 10 arenas per call (nothing left to do,
        # so this is the scan cost) is measured after the real work
        extra.update(pools_released=r.pools_released, bytes_released=r.bytes_released,
                     arenas_scanned=r.arenas_scanned, arenas_skipped=r.arenas_skipped,
                     reclaim_ns=r.elapsed_ns)
        how = "reclaim_pools() + " + trim()
        idle = pools.reclaim_pools()
        extra["idle_reclaim_ns"] = idle.elapsed_ns
        extra["arenas_tracked"] = pools.pool_reclaim_status()["arenas_tracked"]
    elif scenario == "trim+pools/budget=10":
        calls, worst, released = 0, 0, 0
        while True:
            r = pools.reclaim_pools(10)
            calls, worst = calls + 1, max(worst, r.elapsed_ns)
            released += r.pools_released
            if r.complete:
                break
        extra.update(calls=calls, worst_call_ns=worst, pools_released=released)
        how = f"{calls} x reclaim_pools(10) + " + trim()
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
    "trim+pools/budget=10",
    "PYTHONMALLOC=malloc+trim",
    "jemalloc",
    "mimalloc",
    "tcmalloc",
]
WORKLOADS = ["dict-all", "dict-keep1000"]


def run_once(scenario: str, workload: str) -> dict[str, object] | None:
    env = dict(os.environ)
    env.pop("PYTHONMALLOC", None)
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *[p for p in sys.path if p]])
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
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "pools.md")
    args = parser.parse_args()

    rows = []
    for workload in WORKLOADS:
        for scenario in SCENARIOS:
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

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Pool reclaim benchmark",
        "",
        f"Generated by `python benchmarks/bench_pools.py --runs {args.runs}` on {now}:",
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
                f"- {workload}: {median_of(runs, 'pools_released'):.0f} pools released in "
                f"{median_of(runs, 'arenas_scanned'):.0f} arenas "
                f"({mib(median_of(runs, 'bytes_released'))} MiB madvised, "
                f"{median_of(runs, 'arenas_skipped'):.0f} skipped); the releasing call held the "
                f"GIL {median_of(runs, 'reclaim_ns') / 1e6:.1f} ms, a call with nothing to do "
                f"{median_of(runs, 'idle_reclaim_ns') / 1e6:.2f} ms; enable() with its forked "
                f"self-test took {median_of(runs, 'enable_ns') / 1e6:.1f} ms. Header pages kept: "
                f"at most {median_of(runs, 'arenas_tracked'):.0f} arenas x 64 pools x 4 KiB = "
                f"{mib(median_of(runs, 'arenas_tracked') * 64 * 4096)} MiB."
            )
        if scenario == "trim+pools/budget=10":
            details.append(
                f"- {workload}, budget 10 arenas per call: {median_of(runs, 'calls'):.0f} calls, "
                f"the longest held the GIL {median_of(runs, 'worst_call_ns') / 1e6:.2f} ms "
                f"({median_of(runs, 'pools_released'):.0f} pools released in all)."
            )
    out += ["", "Pool reclaim cost (median):", "", *details, ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()
