"""Dask and Ray: memreclaim.integrations.dask (plugin and preload) and .ray (the setup hook).

The cluster tests start real engines on loopback (``LocalCluster(processes=True)``, ``ray.init``)
in a child interpreter, through the benchmark's own driver (benchmarks/bench_dask.py), and
assert memory and behaviour, never time: every wait has a deadline. They are marked ``engines``
and run as CI's ``engines`` step (``python -m pytest -m engines``), which installs the engines;
without them they skip. The argument checks below run everywhere ``distributed`` is installed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import run_child

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def bench(call: str, timeout: float = 400) -> Any:
    """Run ``bench_dask.<call>`` in a child interpreter; its JSON result."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import bench_dask\n"
        f"print('RESULT ' + json.dumps(bench_dask.{call}))\n"
    )
    proc = run_child(code=code, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{call} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def within(rss: int, explicit: int) -> bool:
    return rss <= max(1.15 * explicit, explicit + 16 * MiB)


def assert_trimmed_every_worker(run: dict[str, Any]) -> None:
    assert run["done"], f"{run['finished']} of {run['tasks']} tasks finished: {run}"
    assert len(run["workers"]) == 2, run
    for worker in run["workers"]:
        # the burst happened in this worker (its peak), and what it left went back: RSS once
        # its trimmer was quiet (settle_deadline), within the bound of one explicit trim
        assert worker["peak"] - worker["explicit"] > 150 * MiB, worker
        quiet = "quiet" if worker["quiet"] else "NOT quiet within the deadline"
        assert within(worker["rss_settled"], worker["explicit"]), (
            f"worker {worker['address']}: RSS {worker['rss_settled'] / MiB:.1f} MiB once its"
            f" trimmer was quiet ({quiet})"
            f", {worker['explicit'] / MiB:.1f} MiB after an explicit trim; trimmer"
            f" {worker['trimmer']}; {worker}"
        )
        assert worker["trims"] >= 1, worker


# ---- Dask, real clusters ---------------------------------------------------------------------


@pytest.mark.engines
@pytest.mark.timeout(600)
def test_plugin_trims_every_worker_logs_and_reports_to_the_scheduler() -> None:
    pytest.importorskip("distributed")
    run = bench("run_once('plugin', '1.5GiB', deadline=240, settle_deadline=60)")
    assert_trimmed_every_worker(run)
    for worker in run["workers"]:
        assert worker["trim_log_lines"] >= 1, worker  # in client.get_worker_logs()
        assert worker["scheduler_trims"] == worker["trims"] or worker["scheduler_trims"] >= 1
    assert run["restarts"] == 0, run


@pytest.mark.engines
@pytest.mark.timeout(600)
@pytest.mark.parametrize("route", ["preload", "environ"])
def test_a_tight_limit_finishes_by_each_route(route: str) -> None:
    """700 MiB per worker: the workload that leaves Dask's defaults paused (next test) ends."""
    pytest.importorskip("distributed")
    run = bench(f"run_once({route!r}, '700MiB', deadline=240, settle_deadline=60)")
    assert_trimmed_every_worker(run)
    assert run["restarts"] <= 1, run
    if route == "preload":
        assert all(worker["trim_log_lines"] >= 1 for worker in run["workers"]), run


@pytest.mark.engines
@pytest.mark.timeout(600)
def test_the_workload_pauses_dask_defaults_at_700_mib() -> None:
    """The control: without a trimmer the same workload pauses the workers, for good."""
    pytest.importorskip("distributed")
    run = bench("run_once('defaults', '700MiB', deadline=30, settle=1)")
    assert run["pauses"] >= 1, run
    assert not run["done"], run
    assert all(worker["trims"] is None for worker in run["workers"]), run


RESTART = """
import json, sys, time, urllib.request
sys.path.insert(0, {benchmarks!r})
import bench_dask
from distributed import Client
from memreclaim.integrations.dask import MemreclaimPlugin

def threads():
    import threading
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("memreclaim"))

def wait_for(predicate, what, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise SystemExit(f"no {{what}} within {{seconds}} s")

with bench_dask._cluster("plugin", "1GiB") as cluster, Client(cluster) as client:
    client.wait_for_workers(2, timeout=60)
    client.register_plugin(MemreclaimPlugin())
    before = client.run(bench_dask.worker_figures)
    first = sorted(before)[0]
    client.restart_workers([first])
    def new_worker():
        info = client.scheduler_info(n_workers=-1)["workers"]
        fresh = [a for a in info if a not in before]  # a restarted worker has a new address
        return fresh and all("memreclaim_trims" in info[a]["metrics"] for a in fresh) and fresh
    fresh = wait_for(new_worker, "restarted worker with memreclaim metrics")
    client.gather(client.map(bench_dask.burst, range(4), count=60_000))
    names = client.run(threads)
    def trimmed():
        info = client.scheduler_info(n_workers=-1)["workers"]
        return all(w["metrics"].get("memreclaim_trims", 0) >= 1 for w in info.values())
    wait_for(trimmed, "trim in every worker")
    info = client.scheduler_info(n_workers=-1)["workers"]
    port = info[fresh[0]]["services"]["dashboard"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics", timeout=30).read().decode()
    print("RESULT " + json.dumps({{
        "fresh": fresh, "threads": names,
        # only ours: Dask's own metrics may have tuple keys (task digests), which JSON refuses
        "metrics": {{a: {{k: v for k, v in w["metrics"].items()
                         if isinstance(k, str) and k.startswith("memreclaim_")}}
                     for a, w in info.items()}},
        "prometheus": [l for l in text.splitlines() if l.startswith("memreclaim_")],
    }}, default=str))
"""


@pytest.mark.engines
@pytest.mark.timeout(600)
def test_a_restarted_worker_gets_its_trimmer_back_and_exports_metrics() -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("prometheus_client")
    code = RESTART.format(benchmarks=str(ROOT / "benchmarks"))
    proc = run_child(code=code, timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert len(out["fresh"]) == 1, out
    assert all(names == ["memreclaim-dask"] for names in out["threads"].values()), out
    for metrics in out["metrics"].values():
        assert metrics["memreclaim_trims"] >= 1 and metrics["memreclaim_released_bytes"] > 0
        assert metrics["memreclaim_limit_mark_bytes"] == int((1 << 30) * 0.7)
        assert metrics["memreclaim_pinned_bytes"] > 0
    names = {line.split("{")[0].split(" ")[0] for line in out["prometheus"]}
    assert {"memreclaim_trims_total", "memreclaim_dask_pinned_bytes"} <= names, names


# ---- Ray -------------------------------------------------------------------------------------


@pytest.mark.engines
@pytest.mark.timeout(600)
def test_ray_hook_trims_task_workers_not_the_driver() -> None:
    pytest.importorskip("ray")
    row = bench("ray_once(True, settle_deadline=60)")
    assert row["finished"] == row["tasks"], row
    assert row["driver_trimmer"] is False, row
    assert len({worker["pid"] for worker in row["workers"]}) == 2, row
    for worker in row["workers"]:
        assert worker["trimmer"] is True and worker["trims"] >= 1, worker
        assert worker["peak"] - worker["explicit"] > 150 * MiB, worker
        # once its trimmer was quiet (settle_deadline), within the bound of one explicit trim
        assert within(worker["rss_settled"], worker["explicit"]), (
            f"ray worker {worker['pid']}: RSS {worker['rss_settled'] / MiB:.1f} MiB once its"
            f" trimmer was quiet ({worker['quiet']}), {worker['explicit'] / MiB:.1f} MiB after"
            f" an explicit trim: {worker}"
        )


# ---- the plugin's pieces, no cluster ---------------------------------------------------------


def fake_worker(limit: int | None = 1000 * MiB, spill: Any = 0.7, pause: Any = 0.8) -> Any:
    manager = SimpleNamespace(
        memory_limit=limit, memory_spill_fraction=spill, memory_pause_fraction=pause
    )
    return SimpleNamespace(
        memory_manager=manager, metrics={}, state=SimpleNamespace(nbytes=0), address="fake"
    )


def test_limit_for_takes_the_lower_of_spill_and_pause() -> None:
    dask = pytest.importorskip("memreclaim.integrations.dask")
    assert dask.limit_for(fake_worker()) == (1000 * MiB, 0.7)
    assert dask.limit_for(fake_worker(spill=False)) == (1000 * MiB, 0.8)
    assert dask.limit_for(fake_worker(spill=False, pause=False)) is None
    assert dask.limit_for(fake_worker(limit=None)) is None
    with pytest.raises(TypeError, match="distributed Worker"):
        dask.limit_for(object())


def test_make_trimmer_maps_the_thresholds_and_registers_metrics() -> None:
    dask = pytest.importorskip("memreclaim.integrations.dask")
    worker = fake_worker()
    trimmer = dask.make_trimmer(worker, slack="16 MiB")
    assert trimmer.policy.limit == 1000 * MiB
    assert trimmer.policy.limit_mark == int(1000 * MiB * 0.7)
    assert trimmer.policy.slack == 16 * MiB
    assert not trimmer.running
    assert sorted(worker.metrics) == [
        "memreclaim_limit_mark_bytes",
        "memreclaim_pinned_bytes",
        "memreclaim_released_bytes",
        "memreclaim_trims",
    ]
    assert worker.metrics["memreclaim_trims"](worker) == 0
    assert dask.make_trimmer(fake_worker(), limit=None).policy.limit is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"slack": "lots"}, ValueError),
        ({"interval": -1}, ValueError),
        ({"on_trim": 3}, TypeError),
        ({"bogus": 1}, TypeError),
    ],
)
def test_the_plugin_checks_its_arguments_in_the_client(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    dask = pytest.importorskip("memreclaim.integrations.dask")
    with pytest.raises(error):
        dask.MemreclaimPlugin(**kwargs)


def test_the_plugin_counts_executing_tasks_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    dask = pytest.importorskip("memreclaim.integrations.dask")
    monkeypatch.setattr(dask, "_register_prometheus", lambda figures: None)  # global registry
    worker = fake_worker()
    plugin = dask.MemreclaimPlugin(interval=0.5)
    plugin.setup(worker)
    try:
        trimmer = plugin.trimmer
        assert trimmer is not None and trimmer.running
        plugin.transition("a", "ready", "executing")
        plugin.transition("b", "ready", "executing")
        plugin.transition("a", "executing", "memory")
        assert trimmer.in_flight == 1
        plugin.transition("b", "executing", "error")
        assert trimmer.in_flight == 0
    finally:
        plugin.teardown(worker)
    assert plugin.trimmer is None and not trimmer.running
    assert worker.metrics == {}


def test_the_preload_does_nothing_in_a_scheduler(caplog: pytest.LogCaptureFixture) -> None:
    dask = pytest.importorskip("memreclaim.integrations.dask")
    with caplog.at_level(logging.INFO, logger="distributed.worker.memreclaim"):
        asyncio.run(dask.dask_setup(SimpleNamespace()))
        asyncio.run(dask.dask_teardown(SimpleNamespace()))
    assert "runs no tasks: no trimmer here" in caplog.text
