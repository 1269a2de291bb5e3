"""Cost of the core calls, side by side in one run.

    python benchmarks/bench_core.py [--quick] [--out docs/benchmarks/core.md]

1. rss(): memreclaim.rss() vs the best pure-Python read (kept fd + os.pread + parse), with and
   without the check rss() makes before each read (fstat: the descriptor is still ours), vs
   psutil.Process().memory_info().rss, and the floors: the pread(2) of /proc/self/statm itself,
   and fstat(2) + pread(2), timed in C by a small program compiled at run time.
2. trim(): memreclaim.trim() vs a bare ctypes malloc_trim(0), alternating on the same rebuilt
   fragmented heap (seed 000 shape), wall-clock around each call.
3. A runner tick's reading: _core.sample() (RSS, anonymous RSS and the address space in one
   statm read) beside rss(); and a trim tick's two heap walks (heap_stats() before and after the
   trim, glibc mallinfo2) beside the trim itself, on the same rebuilt heap.

Results are ratios measured in the same run; every figure is the best (min) of several repeats
for the per-call costs, and the median for trim (whose cost depends on the heap).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import memreclaim
from memreclaim import _core, workloads

PREAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int check = argc > 2;
    char buf[160];
    struct stat st;
    int fd = open("/proc/self/statm", O_RDONLY);
    struct timespec a, b;
    double best = 1e9;
    for (int r = 0; r < 7; r++) {
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < n; i++) {
            if (check && fstat(fd, &st) != 0) return 1;
            if (pread(fd, buf, sizeof buf, 0) <= 0) return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
        if (ns < best) best = ns;
    }
    printf("%.1f\n", best);
    return 0;
}
"""


def pread_floor_ns(n: int, check: bool = False) -> float | None:
    """ns per pread(2) of /proc/self/statm (with ``check``, fstat(2) + pread(2)), timed in C;
    None without a C compiler."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "pread.c"
        exe = Path(tmp) / "pread"
        src.write_text(PREAD_C)
        try:
            subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        argv = [str(exe), str(n)] + (["check"] if check else [])
        out = subprocess.run(argv, check=True, capture_output=True, text=True)
        return float(out.stdout)


def python_rss_reader() -> object:
    """The best pure-Python reader we know: a kept descriptor, os.pread, split."""
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    page = os.sysconf("SC_PAGESIZE")
    pread = os.pread

    def read() -> int:
        return int(pread(fd, 160, 0).split()[1]) * page

    return read


def python_checked_reader() -> object:
    """The same, checking before each read that the descriptor is still the one opened (as
    rss() does since issue 30: a daemon may close it and reuse the number)."""
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    page = os.sysconf("SC_PAGESIZE")
    opened = os.fstat(fd)
    identity = (opened.st_dev, opened.st_ino)
    pread, fstat = os.pread, os.fstat

    def read() -> int:
        st = fstat(fd)
        if (st.st_dev, st.st_ino) != identity:
            raise OSError("not our statm")
        return int(pread(fd, 160, 0).split()[1]) * page

    return read


def per_call_ns(func: object, number: int, repeat: int) -> float:
    times = timeit.repeat(func, number=number, repeat=repeat)  # type: ignore[arg-type]
    return min(times) / number * 1e9


def bench_rss(number: int, repeat: int) -> dict[str, float | None]:
    py_read = python_rss_reader()
    py_checked = python_checked_reader()
    try:
        import psutil

        proc = psutil.Process()

        def ps() -> int:
            return int(proc.memory_info().rss)
    except ImportError:
        ps = None  # type: ignore[assignment]
    results: dict[str, list[float]] = {
        "rss()": [],
        "_core.sample()": [],
        "python fstat + pread": [],
        "python pread": [],
        "psutil": [],
    }
    for _ in range(3):  # interleave the contenders
        results["rss()"].append(per_call_ns(memreclaim.rss, number, repeat))
        results["_core.sample()"].append(per_call_ns(_core.sample, number, repeat))
        results["python fstat + pread"].append(per_call_ns(py_checked, number, repeat))
        results["python pread"].append(per_call_ns(py_read, number, repeat))
        if ps is not None:
            results["psutil"].append(per_call_ns(ps, max(number // 20, 1), repeat))
    out: dict[str, float | None] = {k: (min(v) if v else None) for k, v in results.items()}
    out["fstat + pread floor (C)"] = pread_floor_ns(number * 5, check=True)
    out["pread floor (C)"] = pread_floor_ns(number * 5)
    return out


def bench_trim(rounds: int) -> dict[str, list[float]]:
    libc_trim = ctypes.CDLL(None).malloc_trim
    libc_trim.argtypes = [ctypes.c_size_t]
    results: dict[str, list[float]] = {"memreclaim.trim()": [], "ctypes malloc_trim(0)": []}
    released: dict[str, list[int]] = {"memreclaim.trim()": [], "ctypes malloc_trim(0)": []}
    for i in range(rounds):
        order = ["memreclaim.trim()", "ctypes malloc_trim(0)"]
        if i % 2:
            order.reverse()
        for name in order:
            keep = workloads.spike()
            before = memreclaim.rss()
            t0 = time.perf_counter()
            if name == "memreclaim.trim()":
                memreclaim.trim()
            else:
                libc_trim(0)
            results[name].append(time.perf_counter() - t0)
            released[name].append(before - memreclaim.rss())
            del keep
            libc_trim(0)
    results.update({f"{k} released": [float(x) for x in v] for k, v in released.items()})
    return results


def bench_tick_walks(rounds: int) -> dict[str, list[float]]:
    """A trim tick's heap walks beside its trim, on the same rebuilt seed 000 heap: seconds of
    heap_stats() before the trim, of the trim, of heap_stats() after it."""
    results: dict[str, list[float]] = {"walk before": [], "trim()": [], "walk after": []}
    for _ in range(rounds):
        keep = workloads.spike()
        t0 = time.perf_counter()
        memreclaim.heap_stats()
        t1 = time.perf_counter()
        memreclaim.trim()
        t2 = time.perf_counter()
        memreclaim.heap_stats()
        t3 = time.perf_counter()
        results["walk before"].append(t1 - t0)
        results["trim()"].append(t2 - t1)
        results["walk after"].append(t3 - t2)
        del keep
        memreclaim.trim()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    parser.add_argument("--out", type=Path, help="write a markdown report here")
    args = parser.parse_args()
    number, repeat, rounds = (20_000, 3, 2) if args.quick else (200_000, 7, 10)

    rss = bench_rss(number, repeat)
    trim = bench_trim(rounds)
    walks = bench_tick_walks(rounds)
    ours, python = rss["rss()"], rss["python fstat + pread"]
    unchecked, floor = rss["python pread"], rss["fstat + pread floor (C)"]
    assert ours is not None and python is not None and unchecked is not None
    t_ours = statistics.median(trim["memreclaim.trim()"])
    t_bare = statistics.median(trim["ctypes malloc_trim(0)"])

    lines = [
        "# Core call costs",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, Python "
        f"{platform.python_version()}, glibc {platform.libc_ver()[1]}, "
        f"{os.cpu_count()} cores. Command: `python benchmarks/bench_core.py"
        f"{' --quick' if args.quick else ''}`.",
        "",
        "## rss(): ns per call (best of interleaved repeats)",
        "",
        "| reader | ns/call | vs rss() |",
        "|---|---:|---:|",
    ]
    for name, value in rss.items():
        if value is None:
            lines.append(f"| {name} | n/a | |")
        else:
            lines.append(f"| {name} | {value:.0f} | {value / ours:.2f}x |")
    lines += [
        "",
        f"- rss() is **{python / ours:.2f}x** faster than the best pure-Python read making the"
        " same descriptor check (target: at least 1.4x), and"
        f" {unchecked / ours:.2f}x an unchecked one (which a daemon reusing the descriptor"
        " number can feed another file's figures).",
    ]
    if floor is not None:
        lines.append(
            f"- rss() costs **{ours / floor:.2f}x** the same two system calls (fstat(2) +"
            " pread(2)) timed in C (target: within 1.3x)."
        )
    lines += [
        "",
        f"## trim() on the seed 000 heap ({rounds} alternating rounds, median [min-max])",
        "",
        "| call | ms | MiB released |",
        "|---|---:|---:|",
    ]
    for name in ("memreclaim.trim()", "ctypes malloc_trim(0)"):
        ms = [x * 1e3 for x in trim[name]]
        mib = [x / 2**20 for x in trim[f"{name} released"]]
        lines.append(
            f"| {name} | {statistics.median(ms):.1f} [{min(ms):.1f}-{max(ms):.1f}] | "
            f"{statistics.median(mib):.0f} |"
        )
    lines += ["", f"- trim() / bare call: **{t_ours / t_bare:.3f}** (target: within 1.05)."]
    sample_ns = rss["_core.sample()"]
    walk_ms = {k: statistics.median(v) * 1e3 for k, v in walks.items()}
    both = walk_ms["walk before"] + walk_ms["walk after"]
    lines += [
        "",
        f"## A runner tick's reading ({rounds} rounds on the seed 000 heap, median)",
        "",
        f"- `_core.sample()` (RSS, anonymous RSS, address space; one statm read): "
        f"{sample_ns:.0f} ns, {sample_ns / ours:.2f}x rss()."
        if sample_ns is not None
        else "- `_core.sample()`: n/a",
        f"- A trim tick's heap walks (glibc mallinfo2): {walk_ms['walk before']:.2f} ms before"
        f" the trim, {walk_ms['walk after']:.2f} ms after it, beside {walk_ms['trim()']:.1f} ms"
        f" for the trim: the two walks are **{both / walk_ms['trim()']:.3f}x** the trim.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
