"""Real libraries' spikes under the runners at their defaults, on the main thread and in workers.

    python benchmarks/bench_libraries.py [--libraries numpy,pandas,...] [--quick]
        [--out docs/benchmarks/libraries.md]

For each library of ``memreclaim.workloads.LIBRARIES`` (numpy, pandas, pyarrow, Pillow, polars,
json) one burst of ``workloads.library_spike()`` is made in a fresh process, four ways:

- ``Watchdog`` (asyncio, defaults): the spike on the loop's thread, and in ``asyncio.to_thread``;
- ``BackgroundTrimmer`` (defaults): the spike on the main thread, and in a ``ThreadPoolExecutor``.

RSS (from /proc, relative to the process's own baseline after a warm-up burst that imports the
library) is sampled 1, 5 and 30 s after the spike ends (``--quick``: 1 and 5 s), with the
runner's trims and what each part of its last trim gave back. The *reachable* level is measured
in two more processes: the same spike on the main thread then one ``memreclaim.trim()``, and
the library's own release call (pyarrow's ``release_unused()``; none for the others) then a
ctypes ``malloc_trim(0)``; the lower of the two is the level a runner should reach. A cell is
"ok" when RSS 5 s after the spike is within max(1.15 x, +16 MiB) of it.

All cells run one after another in one run of this script, on the same machine; the table
states the load average at the start and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from memreclaim import workloads

MiB = 1 << 20
CHILD = r"""
import asyncio, ctypes, gc, json, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import memreclaim
from memreclaim import workloads
lib, mode, marks = sys.argv[1], sys.argv[2], [float(m) for m in sys.argv[3].split(",")]
workloads.library_spike(lib, scale=0.05)  # imports the library, warms its caches
gc.collect(); memreclaim.trim()
base = memreclaim.rss()
out = {"library": lib, "mode": mode}
kept = []

def sample(counters, t_end):
    rows = []
    for mark in marks:
        time.sleep(max(0.0, t_end + mark - time.monotonic()))
        c = counters()
        rows.append({"at": mark, "rss": memreclaim.rss() - base, "trims": c.trims})
    return rows

if mode in ("reach-trim", "reach-own"):
    kept.append(workloads.library_spike(lib))
    out["spike"] = memreclaim.rss() - base
    if mode == "reach-trim":
        out["parts"] = memreclaim.trim().parts
    else:
        if lib in ("pyarrow", "pandas"):
            import pyarrow
            pyarrow.default_memory_pool().release_unused()
        ctypes.CDLL(None).malloc_trim(0)
    out["level"] = memreclaim.rss() - base
elif mode.startswith("watchdog"):
    async def main():
        async with memreclaim.Watchdog() as wd:
            if mode == "watchdog-thread":
                kept.append(await asyncio.to_thread(workloads.library_spike, lib))
            else:
                kept.append(workloads.library_spike(lib))
            out["spike"] = memreclaim.rss() - base
            t_end = time.monotonic()
            rows = []
            for mark in marks:
                await asyncio.sleep(max(0.0, t_end + mark - time.monotonic()))
                rows.append({"at": mark, "rss": memreclaim.rss() - base,
                             "trims": wd.counters.trims})
            out["samples"] = rows
            out["unproductive"] = wd.counters.unproductive_trims
    asyncio.run(main())
else:
    events = []
    with memreclaim.BackgroundTrimmer(on_trim=events.append) as trimmer:
        if mode == "trimmer-thread":
            with ThreadPoolExecutor(4) as pool:
                kept.append(pool.submit(workloads.library_spike, lib).result())
                out["spike"] = memreclaim.rss() - base
                out["samples"] = sample(lambda: trimmer.counters, time.monotonic())
        else:
            kept.append(workloads.library_spike(lib))
            out["spike"] = memreclaim.rss() - base
            out["samples"] = sample(lambda: trimmer.counters, time.monotonic())
        out["unproductive"] = trimmer.counters.unproductive_trims
        out["last_parts"] = events[-1].result.parts if events else {}
print("RESULT " + json.dumps(out))
"""

MODES = ("watchdog-main", "watchdog-thread", "trimmer-main", "trimmer-thread")


def run(lib: str, mode: str, marks: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, lib, mode, marks],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, object] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"{lib} {mode} failed:\n{proc.stderr[-2000:]}")


def mib(value: object) -> str:
    return "-" if value is None else f"{int(value) / MiB:.1f}"  # type: ignore[call-overload]


def parts_text(parts: object) -> str:
    if not isinstance(parts, dict) or not parts:
        return "-"
    return ", ".join(f"{k} {mib(v)}" for k, v in parts.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libraries", default=",".join(workloads.LIBRARIES))
    parser.add_argument("--quick", action="store_true", help="sample at +1 and +5 s only")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args()
    marks = "1,5" if args.quick else "1,5,30"
    load_start = os.getloadavg()[0]
    lines = [
        "| library | runner, where the spike runs | spike | +1 s | +5 s |"
        + (" +30 s |" if not args.quick else "")
        + " reachable | trims by +5 s | ok | parts of the last trim (MiB) |",
        "|---|---|---:|---:|---:|" + ("---:|" if not args.quick else "") + "---:|---:|---|---|",
    ]
    for lib in args.libraries.split(","):
        try:
            reach_trim = run(lib, "reach-trim", marks)
        except RuntimeError as exc:
            print(f"{lib}: skipped ({str(exc).splitlines()[-1]})", file=sys.stderr)
            continue
        reach_own = run(lib, "reach-own", marks)
        level = min(int(reach_trim["level"]), int(reach_own["level"]))  # type: ignore[call-overload]
        for mode in MODES:
            cell = run(lib, mode, marks)
            samples = cell["samples"]
            assert isinstance(samples, list)
            at5 = next(s for s in samples if s["at"] == 5)
            ok = at5["rss"] <= max(1.15 * level, level + 16 * MiB)
            values = " | ".join(mib(s["rss"]) for s in samples)
            parts = parts_text(cell.get("last_parts"))
            lines.append(
                f"| {lib} | {mode} | {mib(cell['spike'])} | {values} | {mib(level)} "
                f"| {at5['trims']} | {'yes' if ok else 'NO'} | {parts} |"
            )
            print(lines[-1], flush=True)
    load_end = os.getloadavg()[0]
    text = (
        "# Real libraries under the runners\n\n"
        "Generated by `python benchmarks/bench_libraries.py"
        + (" --quick" if args.quick else "")
        + "`; MiB over each process's own baseline (taken after a warm-up burst that imports "
        f"the library). Load average {load_start:.1f} at the start, {load_end:.1f} at the end; "
        f"Python {sys.version.split()[0]}.\n\n"
        "*reachable*: the lower of (the same spike on the main thread, then `memreclaim.trim()`) "
        "and (the library's own release call, then `malloc_trim(0)`). *ok*: RSS 5 s after the "
        "spike within max(1.15 x, +16 MiB) of it. Parts are shown for the BackgroundTrimmer's last "
        "trim (the Watchdog's events are not collected here).\n\n" + "\n".join(lines) + "\n"
    )
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
