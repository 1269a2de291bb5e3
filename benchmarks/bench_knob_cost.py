"""What the runners' thread-retention knobs cost in allocation speed, side by side.

When a trim leaves memory in other threads, the runners set one knob per allocator (or at start
with ``thresholds=True``). glibc rows, one per ``--knobs`` candidate:

- ``128k``: the trim threshold fixed at 128 KiB (``memreclaim.set_trim_threshold``; the
  runners' knob until issue 22), which also freezes the adaptive mmap threshold where it is;
- ``bound2m`` / ``bound4m`` / ``bound8m``: the mmap threshold pinned at its maximum (32 MiB,
  ``memreclaim.pin_mmap_threshold``) and the trim threshold at 2, 4 or 8 MiB: the top of every
  arena keeps at most that much after a free at it (``memreclaim.glibc.bound_thread_tops``).

mimalloc rows: mimalloc 2's purge delay at 0 (``memreclaim.set_purge_delay``). Knobs that make
frees give pages back at once cost system calls and page faults when the program allocates
again. This measures that cost on three allocation patterns, each in a fresh
interpreter, the knob off, set at start (as ``thresholds=True`` does) and set after a first round
of the same work (as the runners do when a trim finds threads retaining, by which time glibc's
adaptive thresholds have risen), in turn (``--runs`` rounds), and reports the median times and
the ratios to "off":

- ``churn``: a 200 KB buffer made, touched and freed, 20,000 times (a large-block loop: the worst
  case, every free gives the pages back and every allocation faults them in again);
- ``small``: 30 rounds of 20,000 strings of 600-4,000 bytes made and dropped;
- ``json``: 15 rounds of dumping and loading a 20,000-key document;
- ``block2m``: a 2 MiB buffer made, touched and freed, 2,000 times (a block above the 128 KiB
  and 1 MiB marks and under glibc's adaptive ceiling);
- ``block20m``: a 20 MB buffer made, touched every page and freed, 150 times (between the
  bounds tried and the 32 MiB mmap ceiling: where a bounded top must give pages back).

    python benchmarks/bench_knob_cost.py [--runs 3] [--knobs 128k,bound4m] [--patterns churn,...]
        [--out docs/benchmarks/knob-cost.md]

Under a preloaded mimalloc it finds the library itself (``--mimalloc PATH`` to choose one);
``--allocators glibc,mimalloc`` chooses the rows.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import memreclaim
knob, pattern, candidate = sys.argv[1], sys.argv[2], sys.argv[3]

def set_knob():
    if memreclaim.allocator() == "mimalloc":
        memreclaim.set_purge_delay(0)
    elif candidate == "128k":
        memreclaim.set_trim_threshold(128 * 1024)
    else:  # boundNm: mmap threshold pinned at its maximum, trim threshold N MiB
        memreclaim.pin_mmap_threshold(memreclaim.glibc.MMAP_THRESHOLD_MAX)
        memreclaim.set_trim_threshold(int(candidate[5:-1]) << 20)

if knob == "start":
    set_knob()

def churn():
    for _ in range(20000):
        b = bytearray(200_000); b[0] = 1; del b

def small():
    for _ in range(30):
        kept = [bytes(600 + (i * 37) % 3400) for i in range(20000)]
        del kept

def json_round():
    doc = {"k%d" % i: ["x" * (i % 900), i, {"a": i}] for i in range(20000)}
    for _ in range(15):
        s = json.dumps(doc); d = json.loads(s); del s, d

def block2m():
    for _ in range(2000):
        b = bytearray(2 << 20); b[0] = 1; del b

def block20m():
    for _ in range(150):
        b = bytearray(20_000_000); b[::4096] = b"\1" * len(b[::4096]); del b

work = {"churn": churn, "small": small, "json": json_round, "block2m": block2m,
        "block20m": block20m}[pattern]
work()  # warm-up: the allocator's caches (and glibc's adaptive thresholds) settle
if knob == "later":
    set_knob()
t = time.perf_counter(); work(); print(json.dumps({"seconds": time.perf_counter() - t}))
"""

PATTERNS = ("churn", "small", "json", "block2m", "block20m")
KNOBS = ("128k", "bound2m", "bound4m", "bound8m")
KNOB_NAMES = {
    "128k": "set_trim_threshold(128 KiB)",
    **{
        f"bound{n}m": f"pin_mmap_threshold(32 MiB) + set_trim_threshold({n} MiB)"
        for n in (1, 2, 4, 8, 16)
    },
}


def find_mimalloc() -> str | None:
    found = sorted(glob.glob("/usr/lib/*-linux-gnu/libmimalloc.so.2*"))
    return found[0] if found else None


def one(knob: str, pattern: str, preload: str | None, candidate: str) -> float:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run(
        [sys.executable, "-c", CHILD, knob, pattern, candidate],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--allocators", default="glibc,mimalloc")
    parser.add_argument("--mimalloc", default=None, help="the libmimalloc to preload")
    parser.add_argument(
        "--knobs", default=",".join(KNOBS), help="glibc candidates: " + ", ".join(KNOB_NAMES)
    )
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--out", default=None, help="write the markdown table here")
    args = parser.parse_args()
    candidates = args.knobs.split(",")
    patterns = args.patterns.split(",")
    for bad in sorted(set(candidates) - set(KNOB_NAMES)) + sorted(set(patterns) - set(PATTERNS)):
        parser.error(f"unknown knob or pattern {bad!r}")
    rows = []
    load_start = os.getloadavg()[0]
    for alloc in args.allocators.split(","):
        preload = None
        if alloc == "mimalloc":
            preload = args.mimalloc or find_mimalloc()
            if preload is None:
                print("no libmimalloc found: mimalloc rows left out", file=sys.stderr)
                continue
        for pattern in patterns:
            for candidate in ["purge0"] if alloc == "mimalloc" else candidates:
                knob = KNOB_NAMES.get(candidate, "set_purge_delay(0)")
                times: dict[str, list[float]] = {"off": [], "start": [], "later": []}
                for _ in range(args.runs):  # in turn, so drifting load hits each alike
                    for when, got in times.items():
                        got.append(one(when, pattern, preload, candidate))
                m = {when: statistics.median(got) for when, got in times.items()}
                rows.append((alloc, knob, pattern, m["off"], m["start"], m["later"]))
                print(
                    f"{alloc:9} {candidate:8} {pattern:8} "
                    + "  ".join(f"{k} {v:.3f}s" for k, v in m.items()),
                    flush=True,
                )
    load_end = os.getloadavg()[0]
    lines = [
        "# What the thread-retention knobs cost",
        "",
        f"Generated by `python benchmarks/bench_knob_cost.py --runs {args.runs}"
        f" --allocators {args.allocators} --knobs {args.knobs} --patterns {args.patterns}`;"
        f" median of {args.runs} fresh interpreters per cell, the three in turn; load average"
        f" {load_start:.1f} at the start, {load_end:.1f} at the end; Python"
        f" {sys.version.split()[0]}.",
        "",
        "| allocator | knob | pattern | off (s) | set at start (s) | x"
        " | set after a round (s) | x |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for alloc, knob, pattern, off, start, later in rows:
        lines.append(
            f"| {alloc} | `{knob}` | {pattern} | {off:.3f} | {start:.3f} | {start / off:.2f}"
            f" | {later:.3f} | {later / off:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
