"""The FastAPI app of docs/integrations.md, set up exactly as the guide says (``pytest -m server``).

The app is read from the page (the Python block whose first line is ``# app.py``; two test-only
routes are appended: ``/`` and ``/trim``) and run by benchmarks/bench_servers.py's
``guide_run`` under uvicorn and under gunicorn with ``uvicorn_worker.UvicornWorker`` (one
worker), on 127.0.0.1. A burst of 12 concurrent requests goes to its ``async def`` endpoint or to
its ``def`` one; then, with no traffic, the lifespan's watchdog trims and RSS goes flat (bounded
wait). The guide predicts, for each kind, that the watchdog ends at the level one explicit
``trim()`` reaches in the same worker (within 15 % or 16 MiB), and nothing lower: its table has
the two levels (the ``def`` one higher), figures of the benchmark, not asserted here.

Its /metrics, mounted as the guide mounts it, shows the trims; SIGINT (to the session, as a
terminal's Ctrl-C) or SIGTERM (to the server, as a container runtime) stops it within a generous
deadline, without a traceback. How long the stop takes is the benchmark's figure, not asserted.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

import memreclaim

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_servers

MiB = 2**20

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(300),
    pytest.mark.skipif(memreclaim.allocator() != "glibc", reason="the retained shape is glibc's"),
]


def test_the_guide_block_is_the_app() -> None:
    """The block the tests run is there and wires what the guide says it wires."""
    app = bench_servers.guide_app()
    for line in (
        "lifespan = watchdog_lifespan()",
        "app = FastAPI(lifespan=lifespan)",
        'app.mount("/metrics", make_asgi_app())',
        "prometheus.register()",
        "async def build_async(",
        "def build_sync(",
    ):
        assert line in app, line


def test_guide_app_lookup_fails_clearly(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# nothing\n\n```python\nprint(1)\n```\n")
    with pytest.raises(LookupError, match=r"# app\.py"):
        bench_servers.guide_app(page)


@pytest.mark.parametrize(
    ("server", "kind", "sig"),
    [
        ("uvicorn", "async", signal.SIGINT),
        ("uvicorn", "sync", signal.SIGTERM),
        ("gunicorn", "async", signal.SIGTERM),
        ("gunicorn", "sync", signal.SIGINT),
    ],
)
def test_guide_app_ends_the_burst_where_the_guide_says(
    tmp_path: Path, server: str, kind: str, sig: int
) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    if server == "gunicorn":
        pytest.importorskip("gunicorn")
        pytest.importorskip("uvicorn_worker")
    run = bench_servers.guide_run(server, kind, tmp_path, sig)
    figures = (
        f"{server} {kind}: base {run['base'] / MiB:.0f}, peak {run['peak'] / MiB:.0f}, end"
        f" {run['end'] / MiB:.0f}, reachable {run['reachable'] / MiB:.0f} MiB; trail"
        f" {run['trail_mib']}; watchdog trims {run['watchdog_trims']}, /metrics"
        f" {run['metrics_trims']}"
    )
    print(figures)
    assert run["settled"], f"no trim after the burst, or RSS not flat, within 60 s: {figures}"
    growth = run["peak"] - run["base"]
    assert growth > 100 * MiB, f"the burst did not grow the worker: {figures}"
    reachable = run["reachable"]
    assert run["end"] <= max(1.15 * reachable, reachable + 16 * MiB), figures
    # the mounted /metrics shows the trims (every trim of the process, the watchdog's included)
    assert run["metrics_trims"] is not None and run["metrics_trims"] >= run["watchdog_trims"] >= 1
    assert run["metrics_released"] and run["metrics_released"] > 50 * MiB, figures
    assert run["stopped_in"] is not None, (
        f"{signal.Signals(sig).name} did not stop {server} within 30 s:\n{run['log']}"
    )
    assert "Traceback" not in run["log"], run["log"]
