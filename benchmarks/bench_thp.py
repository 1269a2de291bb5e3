"""Transparent huge pages set to ``always``: does what a trim gave back stay given back?

With ``/sys/kernel/mm/transparent_hugepage/enabled`` at ``always`` and khugepaged's
``max_ptes_none`` at its default (511), khugepaged turns every 2 MiB range of an eligible mapping
that still holds one resident 4 KiB page into a whole huge page: the sparse heap a trim leaves is
filled again. memreclaim's ``trim()`` therefore marks the allocators' heap mappings
``MADV_NOHUGEPAGE`` after the allocator's trim when the mode is ``always``.

This benchmark sets ``enabled=always`` and ``khugepaged/scan_sleep_millisecs=100`` (khugepaged's
default is 10 s, which takes minutes to show the effect) for the length of one run, and ALWAYS
restores both values (try/finally, SIGINT and SIGTERM too). Four fresh interpreters run side by
side in that same window, each making ``memreclaim.workloads.spike()`` on its main thread:

- ``trim, unmarked``: one ``trim()`` with ``set_thp_marking(False)`` (the behaviour before);
- ``trim, marked``: one ``trim()`` at the defaults (the heap is marked);
- ``trimmer, unmarked`` / ``trimmer, marked``: a ``BackgroundTrimmer()`` at its defaults, its
  trims counted.

Each reports RSS and AnonHugePages right after the trim (for the trimmers: 2 s after the spike)
and every 5 s for ``--seconds``. Targets (issue 22): RSS at the end <= after-trim RSS + 32 MiB, and
<= 3 trims by the trimmer. Needs root (it writes /sys). Other processes on the machine see THP
``always`` while it runs: keep the window short.

    .venv/bin/python benchmarks/bench_thp.py --out docs/benchmarks/thp.md
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage")
ENABLED = THP / "enabled"
SCAN_SLEEP = THP / "khugepaged" / "scan_sleep_millisecs"
CASES = {
    "trim, unmarked": ("trim", False),
    "trim, marked": ("trim", True),
    "trimmer, unmarked": ("trimmer", False),
    "trimmer, marked": ("trimmer", True),
}

CHILD = r"""
import json, sys, time
import memreclaim
from memreclaim import _core, workloads

kind, marking, seconds, step = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3]), 5.0
_core.set_thp_marking(marking)

def sample(t0):
    st = memreclaim.stats()
    return {"t": round(time.monotonic() - t0, 1), "rss": st.rss, "huge": st.anon_huge_pages}

trimmer = memreclaim.BackgroundTrimmer() if kind == "trimmer" else None
if trimmer is not None:
    trimmer.start()
survivors = workloads.spike()
peak = memreclaim.rss()
result = None
if trimmer is None:
    result = memreclaim.trim()
else:
    time.sleep(2.0)
t0 = time.monotonic()
samples = [sample(t0)]
while time.monotonic() - t0 < seconds - 1e-3:
    time.sleep(max(0.0, min(step * len(samples), seconds) - (time.monotonic() - t0)))
    samples.append(sample(t0))
out = {"peak": peak, "samples": samples, "survivors": len(survivors)}
if result is not None:
    out.update(after_trim=result.rss_after, thp_mode=result.thp_mode,
               thp_marked=result.thp_marked, thp_reason=result.thp_reason)
if trimmer is not None:
    trimmer.stop()
    out["trims"] = trimmer.counters.trims
    out["unproductive"] = trimmer.counters.unproductive_trims
print(json.dumps(out))
"""


def read_word(path: Path) -> str:
    text = path.read_text().strip()
    if "[" in text:
        return text[text.index("[") + 1 : text.index("]")]
    return text


def run(seconds: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Set THP always + 100 ms, run the four cases side by side, restore. Returns the results and
    what the window looked like."""
    saved = {ENABLED: read_word(ENABLED), SCAN_SLEEP: read_word(SCAN_SLEEP)}
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in previous:
        signal.signal(sig, interrupted)
    children: dict[str, subprocess.Popen[str]] = {}
    window: dict[str, Any] = {"saved": {str(k): v for k, v in saved.items()}}
    try:
        ENABLED.write_text("always")
        SCAN_SLEEP.write_text("100")
        window["start"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        window["load_before"] = os.getloadavg()
        started = time.monotonic()
        for name, (kind, marking) in CASES.items():
            argv = [sys.executable, "-c", CHILD, kind, "1" if marking else "0", str(seconds)]
            children[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        results = {}
        for name, child in children.items():
            out, _ = child.communicate(timeout=seconds + 120)
            if child.returncode != 0:
                raise RuntimeError(f"{name}: exit {child.returncode}")
            results[name] = json.loads(out)
        window["seconds"] = round(time.monotonic() - started, 1)
        window["load_after"] = os.getloadavg()
        return results, window
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
        for path, value in saved.items():
            path.write_text(value)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        restored = {str(p): read_word(p) for p in saved}
        print(f"restored {restored}", file=sys.stderr)


def report(results: dict[str, dict[str, Any]], window: dict[str, Any]) -> str:
    def mib(value: int | None) -> str:
        return "n/a" if value is None else f"{value / MiB:.0f}"

    times = [s["t"] for s in next(iter(results.values()))["samples"]]
    lines = [
        "# THP `always`: what a trim gave back, over time",
        "",
        f"Produced by `benchmarks/bench_thp.py` on {window['start']}: THP `enabled=always`, "
        "`khugepaged/scan_sleep_millisecs=100` for "
        f"{window['seconds']} s, then restored to {window['saved']}. The four cases ran side by "
        f"side in that window (load average {window['load_before'][0]:.2f} before, "
        f"{window['load_after'][0]:.2f} after, 2 CPUs). Each makes `workloads.spike()` "
        "(~370 MiB, 1 in 50 strings kept) on its main thread. RSS / AnonHugePages in MiB; "
        "t=0 is right after the trim (trimmers: 2 s after the spike).",
        "",
        "| case | peak | " + " | ".join(f"t={t:.0f} s" for t in times) + " | trims | end - start |",
        "|---|---:|" + "---:|" * len(times) + "---:|---:|",
    ]
    for name, out in results.items():
        cells = [f"{mib(s['rss'])} / {mib(s['huge'])}" for s in out["samples"]]
        growth = out["samples"][-1]["rss"] - out["samples"][0]["rss"]
        trims = str(out.get("trims", 1))
        lines.append(
            f"| {name} | {mib(out['peak'])} | " + " | ".join(cells) + f" | {trims} | "
            f"{growth / MiB:+.0f} MiB |"
        )
    lines += ["", "Raw results:", "", "```json", json.dumps(results, indent=1), "```", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to watch (40)")
    parser.add_argument("--out", type=Path, help="write the markdown table there")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_thp.py needs root: it sets THP in /sys/kernel/mm", file=sys.stderr)
        return 2
    if not ENABLED.exists():
        print("this kernel has no transparent huge pages", file=sys.stderr)
        return 2
    results, window = run(args.seconds)
    text = report(results, window)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
