"""The real-service case of benchmarks/run.py: an HTTP service hit by a burst, then light traffic.

The service (benchmarks/cases/service.py, stdlib ThreadingHTTPServer on 127.0.0.1) builds large
report responses; a client in this process sends a burst of concurrent ``/report`` requests,
then one ``/ping`` every 20 ms, timing each, while a sampler reads the server's VmRSS from
/proc every 50 ms. Variants: the service as is, under ``python -m memreclaim run`` (a periodic
trimmer), and under jemalloc with decay 0.
"""

from __future__ import annotations

import http.client
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SERVICE = HERE / "cases" / "service.py"
MiB = 1 << 20


def service_argvs(quick: bool) -> list[tuple[str, list[str], str, dict[str, str]]]:
    """(label, argv, allocator, env) of each variant."""
    per_request = ["--per-request", "4000" if quick else "8000"]
    plain = [sys.executable, str(SERVICE), *per_request]
    trimmer = [
        sys.executable,
        "-m",
        "memreclaim",
        "run",
        "--interval",
        "0.5",
        "--slack",
        "32MiB",
        "--",
        str(SERVICE),
        *per_request,
    ]
    pinned = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # the default value, but fixed: not adaptive
    jemalloc = {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}
    rows = [
        ("glibc, no trimmer", plain, "glibc", {}),
        ("glibc, memreclaim run", trimmer, "glibc", {}),
        ("glibc, MALLOC_MMAP_THRESHOLD_=131072, no trimmer", plain, "glibc", pinned),
        ("glibc, MALLOC_MMAP_THRESHOLD_=131072, memreclaim run", trimmer, "glibc", pinned),
        ("jemalloc decay 0, no trimmer", plain, "jemalloc", jemalloc),
    ]
    return rows[:2] if quick else rows


def _vmrss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _get(conn: http.client.HTTPConnection, path: str) -> float:
    start = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {response.status}")
    return time.perf_counter() - start


def run_service(argv: list[str], env: dict[str, str], quick: bool) -> dict[str, Any]:
    """Start the service, drive it, stop it; return RSS samples, latencies and the trim report."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the service did not start: {line!r}")
        port = int(line.split()[1])
        samples: list[tuple[float, int]] = []
        stop = threading.Event()
        t0 = time.perf_counter()

        def sample() -> None:
            while not stop.wait(0.05):
                rss = _vmrss(proc.pid)
                if rss is not None:
                    samples.append((time.perf_counter() - t0, rss))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(0.5)
        baseline = _vmrss(proc.pid) or 0
        workers, per_worker = (4, 2) if quick else (8, 5)

        def burst_worker(_: int) -> list[float]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                return [_get(conn, "/report") for _ in range(per_worker)]
            finally:
                conn.close()

        burst_start = time.perf_counter() - t0
        with ThreadPoolExecutor(workers) as pool:
            report_latency = [x for xs in pool.map(burst_worker, range(workers)) for x in xs]
        burst_end = time.perf_counter() - t0
        after_burst = _vmrss(proc.pid) or 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        ping_latency: list[float] = []
        light_until = time.perf_counter() + (2.0 if quick else 10.0)
        while time.perf_counter() < light_until:
            ping_latency.append(_get(conn, "/ping"))
            time.sleep(0.02)
        conn.close()
        end = _vmrss(proc.pid) or 0
        stop.set()
        sampler.join()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
    ping_ms = sorted(x * 1000 for x in ping_latency)
    report_line = next((ln for ln in stderr.splitlines() if ln.startswith("memreclaim run:")), "")
    return {
        "baseline": baseline,
        "peak": max(r for _, r in samples),
        "after_burst": after_burst,
        "end": end,
        "burst_seconds": burst_end - burst_start,
        "burst_window": [burst_start, burst_end],
        "report_ms_p50": statistics.median(report_latency) * 1000,
        "ping_ms_p50": statistics.median(ping_ms),
        "ping_ms_p99": ping_ms[min(len(ping_ms) - 1, int(len(ping_ms) * 0.99))],
        "ping_ms_max": ping_ms[-1],
        "pings": len(ping_ms),
        "trimmer_report": report_line,
        "samples": [(round(t, 3), r) for t, r in samples],
    }


def plot_service(runs: list[tuple[str, list[dict[str, Any]]]], path: Path) -> bool:
    """RSS of the service over time, the median run (by end RSS) of each variant."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    for label, results in runs:
        ordered = sorted(results, key=lambda r: r["end"])
        mid = ordered[len(ordered) // 2]
        start, end = mid["burst_window"]
        times = [t - start for t, _ in mid["samples"]]
        (line,) = ax.plot(times, [r / MiB for _, r in mid["samples"]], label=label)
        at_end = min(mid["samples"], key=lambda s: abs(s[0] - end))
        ax.plot([end - start], [at_end[1] / MiB], marker="x", markersize=9, color=line.get_color())
    ax.set_xlabel("seconds since the burst started (x: the burst is over, light traffic follows)")
    ax.set_ylabel("service RSS, MiB (median run)")
    ax.set_ylim(bottom=0)
    ax.set_title("HTTP service: a burst of large responses, then light traffic", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return True
