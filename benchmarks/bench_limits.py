"""Soft-limit mode against a fixed slack, in a real 512 MiB cgroup v1, on the two-phase workload.

The workload is issue 13's: a service whose live cache grows in ``--steps`` 16 MiB steps, one
every 1.5 s (so the runner goes through unproductive trims first, and backs off), then a
fragmented ~330 MiB spike of strings with 2 % kept, freed, and after a gap (``--gap``) 300 MiB of
fresh buffers allocated one 10 MiB buffer every ``--pace`` seconds. Without trimming it needs
more than 512 MiB.

Each run is a fresh interpreter placed in a fresh cgroup v1 memory cgroup with
``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``) at 512 MiB. Modes:

- ``none``: no runner;
- ``slack-64MiB``: ``BackgroundTrimmer(limit=None, slack="64MiB")``, a fixed slack;
- ``slack-auto``: ``BackgroundTrimmer(limit=None)``, the learned-level slack, no limit;
- ``soft-limit``: ``BackgroundTrimmer()`` at its defaults (``limit="auto"`` finds the cgroup's).

Reported per mode and pace: how many runs completed / were OOM-killed, the cgroup's peak usage
(``memory.max_usage_in_bytes``, median), the trims and the unproductive trims before the spike.
Modes run interleaved, ``--runs`` rounds. Needs root and a cgroup v1 memory controller.

    .venv/bin/python benchmarks/bench_limits.py --runs 3 --out docs/benchmarks/limits.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
V1_ROOT = Path("/sys/fs/cgroup/memory")
LIMIT = 512 * MiB
MODES: dict[str, dict[str, Any] | None] = {  # BackgroundTrimmer keyword arguments
    "none": None,
    "slack-64MiB": {"limit": None, "slack": "64MiB"},
    "slack-auto": {"limit": None},
    "soft-limit": {},
}

CHILD = """
import json, os, sys, time
with open(os.environ["BENCH_CGROUP"] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
import memreclaim
from memreclaim import workloads

def say(**kw):
    print(json.dumps(kw), flush=True)

def on_trim(event):
    say(event="trim", productive=event.productive, released=event.released)

kwargs = json.loads(os.environ["BENCH_RUNNER"])
runner = None if kwargs is None else memreclaim.BackgroundTrimmer(on_trim=on_trim, **kwargs)
if runner is not None:
    runner.start()
cache = []
for step in range(int(os.environ["BENCH_STEPS"])):  # live growth: trims learn it, unproductively
    cache.extend(bytes(4096) for _ in range(4096))
    time.sleep(1.5)
say(event="spike")
data = workloads.strings(150_000)            # ~330 MiB of malloc'd strings
survivors = workloads.keep_every(data, 50)   # keep 2 %: the heap is fragmented
del data
time.sleep(float(os.environ["BENCH_GAP"]))
pace = float(os.environ["BENCH_PACE"])
buffers = []
for _ in range(30):                           # 300 MiB of fresh buffers, touched
    b = bytearray(10 << 20)
    b[::4096] = b"x" * len(b[::4096])
    buffers.append(b)
    time.sleep(pace)
if runner is not None:
    runner.stop()
say(event="done")
"""


class Cgroup:
    """A fresh cgroup v1 memory cgroup with a 512 MiB limit, removed on close."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("bench_limits: needs root (cgroup v1)")
        if not (V1_ROOT / "memory.limit_in_bytes").exists():
            raise SystemExit(f"bench_limits: no cgroup v1 memory controller at {V1_ROOT}")
        self.path = V1_ROOT / f"memreclaim-bench-{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(LIMIT))
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(LIMIT))

    def reset_peak(self) -> None:
        (self.path / "memory.max_usage_in_bytes").write_text("0")

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def run_once(cg: Cgroup, mode: str, pace: float, gap: float, steps: int) -> dict[str, Any]:
    """One fresh interpreter in the cgroup: what happened, read from its output and the cgroup."""
    cg.reset_peak()
    kills = cg.oom_kills()
    env = dict(os.environ, BENCH_CGROUP=str(cg.path), BENCH_PACE=str(pace), BENCH_GAP=str(gap))
    env["BENCH_STEPS"] = str(steps)
    env["BENCH_RUNNER"] = json.dumps(MODES[mode])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    spike_at = names.index("spike") if "spike" in names else len(events)
    trims = [e for e in events if e["event"] == "trim"]
    before = [e for e in events[:spike_at] if e["event"] == "trim"]
    completed = proc.returncode == 0 and "done" in names
    if proc.returncode not in (0, -9):
        raise SystemExit(f"bench_limits: {mode} failed ({proc.returncode}):\n{proc.stderr}")
    return {
        "mode": mode,
        "pace": pace,
        "gap": gap,
        "completed": completed,
        "oom_killed": cg.oom_kills() > kills,
        "peak": cg.peak(),
        "trims": len(trims),
        "unproductive_before": sum(1 for e in before if not e["productive"]),
        "released": sum(e["released"] for e in trims),
    }


def table(results: list[dict[str, Any]], gaps: list[float], paces: list[float]) -> str:
    lines = [
        "| gap | buffer pace | mode | completed | OOM-killed | peak (cgroup, median) "
        "| trims (median) | unproductive before the spike (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for gap in gaps:
        for pace in paces:
            for mode in MODES:
                rows = [
                    r
                    for r in results
                    if r["mode"] == mode and r["pace"] == pace and r["gap"] == gap
                ]
                n = len(rows)
                lines.append(
                    f"| {gap:g} s | {pace * 1000:.0f} ms | {mode} "
                    f"| {sum(r['completed'] for r in rows)}/{n} "
                    f"| {sum(r['oom_killed'] for r in rows)}/{n} "
                    f"| {statistics.median(r['peak'] for r in rows) / MiB:.0f} MiB "
                    f"| {statistics.median(r['trims'] for r in rows):g} "
                    f"| {statistics.median(r['unproductive_before'] for r in rows):g} |"
                )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds over every mode and pace")
    parser.add_argument(
        "--pace", type=float, action="append", help="seconds between buffers (repeatable)"
    )
    parser.add_argument(
        "--gap", type=float, action="append", help="seconds between the phases (repeatable)"
    )
    parser.add_argument(
        "--steps", type=int, default=8, help="16 MiB steps of live growth before the spike"
    )
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    args = parser.parse_args()
    paces = args.pace or [0.1, 0.02]
    gaps = args.gap or [0.0, 1.5]
    cg = Cgroup()
    results = []
    try:
        for round_ in range(args.runs):
            for gap in gaps:
                for pace in paces:
                    for mode in MODES:
                        r = run_once(cg, mode, pace, gap, args.steps)
                        print(f"round {round_ + 1}: {json.dumps(r)}", flush=True)
                        results.append(r)
    finally:
        cg.close()
    text = table(results, gaps, paces)
    load = os.getloadavg()[0]
    header = (
        f"{args.runs} rounds, {args.steps} steps of live growth,"
        f" machine load {load:.1f} at the end, Python {sys.version.split()[0]}\n\n"
    )
    print(header + text)
    if args.out:
        args.out.write_text(
            "# Soft-limit mode vs a fixed slack (512 MiB cgroup v1, two-phase workload)\n\n"
            "Made by `python benchmarks/bench_limits.py"
            f" --runs {args.runs} --steps {args.steps} --out {args.out}`; see"
            " the script's docstring for the"
            " workload.\n\n" + header + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
