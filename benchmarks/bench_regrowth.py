"""Regrowth benchmark: how many trims does a runner make when every trim is undone at once?

Under transparent huge pages ``enabled=always`` khugepaged can fault back in the pages a trim
released, with no allocation (issue 22: 369 -> 43 MiB, back to 367 MiB within 40 s). This
simulates it where THP cannot be set: a 160 MiB anonymous region, mapped once, is touched; each
trim also releases it (``MADV_DONTNEED``) and the ``on_trim`` callback touches it again at once,
so RSS climbs straight back with neither the heap's in-use bytes nor the address space growing.
The runner's THP detection is set to ``always`` for the run.

Side by side in one run, each in a fresh interpreter, a ``BackgroundTrimmer`` at its defaults
for ``--seconds`` (40) after the first trim:

  thp-off   the regrowth rule off (the runner's THP detection says not ``always``): every
            regrowth is growth, trimmed again at the pace of the rising check and min_interval
  thp-on    the rule on: the regrown level is provisional, re-tested at 8, 16, 32 s...

    python benchmarks/bench_regrowth.py            # ~90 s

Prints the trims made in the window and their times; the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

CASE = textwrap.dedent(
    """
    import json, mmap, sys, threading, time
    import memreclaim
    import memreclaim.runners._base as wd
    from memreclaim import BackgroundTrimmer
    from memreclaim._core import TrimResult

    wd._thp_always = sys.argv[1] == "thp-on"
    SECONDS = float(sys.argv[2])
    SIZE = 160 * 2**20
    region = mmap.mmap(-1, SIZE)
    real_trim = memreclaim.trim

    def touch():
        for offset in range(0, SIZE, mmap.PAGESIZE):
            region[offset] = 1

    def trim(*, pools=False):
        before = memreclaim.rss()
        result = real_trim(pools=pools)
        region.madvise(mmap.MADV_DONTNEED)
        after = memreclaim.rss()
        return TrimResult((before - after, before, after, None, None, result.seconds,
                           result.allocator, result.method, 0, 0, None, None,
                           {"glibc": before - after}))

    memreclaim.trim = trim
    stamps = []

    def on_trim(event):
        stamps.append(time.monotonic())
        touch()

    with BackgroundTrimmer(on_trim=on_trim) as runner:
        touch()
        deadline = time.monotonic() + 60.0
        while not stamps and time.monotonic() < deadline:
            time.sleep(0.05)
        if stamps:
            time.sleep(max(0.0, stamps[0] + SECONDS - time.monotonic()))
        first = stamps[0] if stamps else None
        times = [round(t - first, 2) for t in stamps if t < first + SECONDS] if stamps else []
    print("RESULT " + json.dumps(dict(times=times, retests=runner.counters.retest_trims)))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for variant in ("thp-off", "thp-on"):
        proc = subprocess.run(
            [sys.executable, "-c", CASE, variant, str(args.seconds)],
            capture_output=True,
            text=True,
            timeout=args.seconds + 120,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{variant} failed:\n{proc.stdout}\n{proc.stderr}")
        rows.append((variant, json.loads(lines[-1][len("RESULT ") :])))
    load_after = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f}, after: {load_after[0]:.2f}")
    print(f"BackgroundTrimmer() at defaults, {args.seconds:.0f} s from the first trim")
    for variant, found in rows:
        times = found["times"]
        print(f"{variant:8} trims {len(times):3}  at {times}")


if __name__ == "__main__":
    main()
