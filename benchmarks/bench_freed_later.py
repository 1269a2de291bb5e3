"""Freed-later benchmark: survivors of a spike pin pages; when they are freed, how soon does a
runner give the memory back?

Issue 22's shape: ``workloads.spike(130_000, every=20)`` (~300 MiB of strings built, 1 in 20
kept: ~15 MiB of survivors that pin ~44 MiB of heap pages). The runner trims the spike and
learns the pinned level; the survivors are then freed (their free-bytes rise stays under a
16 MiB slack). Measured: seconds from that free until RSS is within 16 MiB of the level one
direct ``trim()`` reaches afterwards (taken in the same process, after the runner stopped).

Side by side in one run, each case in a fresh interpreter, for both runners at
``interval=0.1, slack="16 MiB"`` and at their defaults:

  before   the policy without the allocator's figures (``in_use``, ``vsize``, ``mapped``
           withheld: the decisions of the policy before issue 22, free bytes only)
  after    the policy with them (a drop of in-use bytes is sized with the pinned excess)

    python benchmarks/bench_freed_later.py          # ~1 minute on an idle machine

The load average is printed before and after; the figures are seconds (``>10.0`` when the
memory had not come back when the 10 s window closed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

WINDOW = 10.0
NEAR = 16 * 2**20

CASE = textwrap.dedent(
    """
    import asyncio, dataclasses, gc, json, sys, threading, time
    import memreclaim
    from memreclaim import BackgroundTrimmer, PacingPolicy, Watchdog, workloads

    RUNNER, VARIANT = sys.argv[1], sys.argv[3]
    INTERVAL, WINDOW = float(sys.argv[2]), float(sys.argv[4])

    class Before(PacingPolicy):
        # The policy's decisions before issue 22: the same rules with the figures withheld.
        def wants_free(self, now, rss=None):
            return super().wants_free(now)
        def decide(self, reading):
            return super().decide(dataclasses.replace(reading, in_use=None, vsize=None))
        def record_trim(self, outcome):
            return super().record_trim(dataclasses.replace(
                outcome, in_use=None, mapped=None, vsize=None, unreached=False))
        def reset(self, now, rss, traced=None, *, in_use=None):
            super().reset(now, rss, traced)

    def policy():
        cls = Before if VARIANT == "before" else PacingPolicy
        return cls(slack="16 MiB") if INTERVAL < 1.0 else cls()

    def wait_learnt(counters, sleep):
        # the spike trimmed and the level learnt: a trim, then 2 s without one (deadline 60 s)
        deadline = time.monotonic() + 60.0
        last, since = 0, time.monotonic()
        while time.monotonic() < deadline:
            trims = counters().trims
            if trims != last:
                last, since = trims, time.monotonic()
            if trims and time.monotonic() - since >= 2.0:
                return True
            yield sleep
        return False

    def result(samples, freed_at, pinned, trims_before, trims_after):
        memreclaim.trim()
        reference = memreclaim.rss()
        back = next((t - freed_at for t, r in samples if r <= reference + NEAR), None)
        print("RESULT " + json.dumps(dict(
            back=back, pinned=pinned, reference=reference, trims=trims_after - trims_before)))

    NEAR = 16 * 2**20

    def thread_case():
        runner = BackgroundTrimmer(interval=INTERVAL, policy=policy())
        with runner:
            survivors = workloads.spike(130_000, every=20)
            for pause in wait_learnt(lambda: runner.counters, 0.05):
                time.sleep(pause)
            pinned, trims_before = memreclaim.rss(), runner.counters.trims
            del survivors
            gc.collect()
            freed_at = time.monotonic()
            samples = []
            while time.monotonic() < freed_at + WINDOW:
                samples.append((time.monotonic(), memreclaim.rss()))
                time.sleep(0.01)
            trims_after = runner.counters.trims
        result(samples, freed_at, pinned, trims_before, trims_after)

    async def loop_case():
        runner = Watchdog(interval=INTERVAL, policy=policy())
        async with runner:
            survivors = workloads.spike(130_000, every=20)
            for pause in wait_learnt(lambda: runner.counters, 0.05):
                await asyncio.sleep(pause)
            pinned, trims_before = memreclaim.rss(), runner.counters.trims
            del survivors
            gc.collect()
            freed_at = time.monotonic()
            samples = []
            while time.monotonic() < freed_at + WINDOW:
                samples.append((time.monotonic(), memreclaim.rss()))
                await asyncio.sleep(0.01)
            trims_after = runner.counters.trims
        result(samples, freed_at, pinned, trims_before, trims_after)

    if RUNNER == "BackgroundTrimmer":
        thread_case()
    else:
        asyncio.run(loop_case())
    """
)


def run_case(runner: str, interval: float, variant: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CASE, runner, str(interval), variant, str(WINDOW)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{runner} {interval} {variant} failed:\n{proc.stdout}\n{proc.stderr}")
    found: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for runner in ("BackgroundTrimmer", "Watchdog"):
        for interval in (0.1, 1.0):
            cells = {
                variant: run_case(runner, interval, variant) for variant in ("before", "after")
            }
            rows.append((runner, interval, cells))
    load_after = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f}, after: {load_after[0]:.2f}")
    print(f"seconds until RSS is within 16 MiB of a direct trim's level (window {WINDOW:.0f} s)")
    print(f"{'runner':18} {'settings':26} {'pinned MiB':>10} {'before':>8} {'after':>8}")
    for runner, interval, cells in rows:
        settings = 'interval=0.1, slack="16 MiB"' if interval < 1.0 else "defaults"
        pinned = (cells["after"]["pinned"] - cells["after"]["reference"]) / 2**20
        figures = []
        for variant in ("before", "after"):
            back = cells[variant]["back"]
            figures.append(f">{WINDOW:.1f}" if back is None else f"{back:.2f}")
        print(f"{runner:18} {settings:26} {pinned:10.1f} {figures[0]:>8} {figures[1]:>8}")


if __name__ == "__main__":
    main()
