"""Every documented runner and recipe in a real server gives a burst back (``pytest -m server``).

uvicorn (handlers on the loop and offloaded) and gunicorn (sync, gthread with 4 threads) run the
app of benchmarks/bench_servers.py on 127.0.0.1: a burst of 12 concurrent requests building
60,000 rows each (every 50th kept), then light traffic while the worker's RSS is polled from
/proc/PID/statm, with an overall deadline, until the runner has trimmed after the burst and RSS
is flat. Then one explicit trim measures the reachable level in the same process: RSS before it
must be within 15 % (or 16 MiB) of it. Memory is asserted, never time (the benchmark reports
the times).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import peak_rss

import memreclaim

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_servers

MiB = 2**20
DEADLINE = 60.0

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(300),
    pytest.mark.skipif(memreclaim.allocator() != "glibc", reason="the retained shape is glibc's"),
]


@pytest.mark.parametrize(
    ("setup", "recipe"),
    [
        ("uvicorn-loop", "watchdog"),
        ("uvicorn-loop", "middleware"),
        ("uvicorn-loop", "trimmer"),
        ("uvicorn-offload", "middleware"),
        ("gunicorn-sync", "hooks"),
        ("gunicorn-gthread", "hooks"),
    ],
)
def test_runner_gives_the_burst_back(tmp_path: Path, setup: str, recipe: str) -> None:
    pytest.importorskip("uvicorn" if setup.startswith("uvicorn") else "gunicorn")
    proc, port = bench_servers.start_server(setup, recipe, tmp_path)
    try:
        pid = bench_servers.get(port, "/ping")["pid"]
        base = bench_servers.statm_rss(pid) or 0
        _, burst_end, burst_pid = bench_servers.send_burst(port, spread=0.0)
        assert burst_pid == pid, "one worker expected"
        peak = peak_rss(pid)
        trail: list[int] = []
        counters: dict[str, Any] = {}
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:  # light traffic while polling
            bench_servers.get(port, "/ping")
            time.sleep(0.2)
            trail.append(bench_servers.statm_rss(pid) or 0)
            counters = bench_servers.get(port, "/counters")
            trimmed_after = [t for t in counters["trims"] if t[0] >= burst_end]
            if trimmed_after and len(trail) >= 3 and abs(trail[-1] - trail[-3]) < 2 * MiB:
                break
        else:
            pytest.fail(
                f"{setup}/{recipe}: no trim after the burst within {DEADLINE:.0f} s "
                f"(trims {counters.get('trims')}, RSS trail MiB {[v >> 20 for v in trail]})"
            )
        before = bench_servers.statm_rss(pid) or 0
        reachable = bench_servers.get(port, "/trim")["rss"]
    finally:
        bench_servers.stop_server(proc)
    assert peak - base > 100 * MiB, f"the burst did not grow the worker ({base=}, {peak=})"
    bound = max(1.15 * reachable, reachable + 16 * MiB)
    assert before <= bound, (
        f"{setup}/{recipe}: RSS {before / MiB:.1f} MiB after the runner's trims, reachable "
        f"{reachable / MiB:.1f} MiB (peak {peak / MiB:.1f}, base {base / MiB:.1f}); "
        f"trims {counters['trims']}"
    )
