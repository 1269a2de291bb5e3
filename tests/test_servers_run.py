"""``memreclaim run`` and ``MEMRECLAIM=1`` follow a server's processes (``pytest -m server``).

Each pre-fork or spawning server runs with no memreclaim code in its app (the app of
benchmarks/bench_servers.py with no recipe, or a Celery app with no handlers), started as
``python -m memreclaim run -m SERVER ...`` or as ``MEMRECLAIM=1 python -m SERVER ...``, on
127.0.0.1 with two workers (two prefork pool processes for Celery):

- the workers are found as the master's children in /proc (uvicorn's spawn supervisor also
  runs multiprocessing's resource tracker: not a worker);
- each worker's baseline is its RSS (/proc/PID/statm) before any burst; rounds of 12 concurrent
  requests (tasks), each building 60,000 rows and keeping every 50th, go on until every worker
  has served at least two (bounded: at most 6 rounds);
- then, with no traffic at all (nothing but the trimmer can act), every worker's RSS must fall
  back under its baseline plus a quarter of its growth (VmHWM - baseline): the level the
  documented hooks reach (docs/integrations.md; tests/test_integrations.py), polled with an
  overall deadline;
- every worker reports trims of its own: ``memreclaim.totals()`` from each worker (HTTP
  responses or task results), and under ``run`` the exit line each forked worker prints.

The control (plain ``python -m gunicorn``, nothing activated) shows the same burst stays: the
assertion above can fail. Memory is asserted, never time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import peak_rss

import memreclaim

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_servers

MiB = 2**20
DEADLINE = 90.0  # for the workers to give their bursts back, on a loaded machine
WORKERS = 2

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(400),
    pytest.mark.skipif(memreclaim.allocator() != "glibc", reason="the retained shape is glibc's"),
]

RUN = [sys.executable, "-m", "memreclaim", "run", "-m"]


def children(pid: int) -> list[int]:
    """The live children of ``pid`` that are not multiprocessing's helpers, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "resource_tracker" not in cmdline:
            found.append(int(entry))
    return sorted(found)




def wait_for_workers(master: int, count: int, log: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = children(master)
        if len(pids) >= count:
            return pids[:count] if len(pids) == count else pids
        time.sleep(0.2)
    pytest.fail(f"{count} workers of {master} did not appear in 60 s:\n{log.read_text()}")


def settle(pids: list[int]) -> dict[int, int]:
    """Each worker's RSS once it is steady (two readings 0.5 s apart within 1 MiB; bounded)."""
    base: dict[int, int] = {}
    for pid in pids:
        last = bench_servers.statm_rss(pid) or 0
        for _ in range(20):
            time.sleep(0.5)
            now = bench_servers.statm_rss(pid) or 0
            if abs(now - last) < MiB:
                break
            last = now
        base[pid] = now
    return base


def settled_after_burst(
    pids: list[int], base: dict[int, int], what: str, log: Path
) -> dict[int, int]:
    """Wait (no traffic, so nothing but a trimmer acts) until every worker's RSS is below its
    peak and flat (seven readings 0.5 s apart within 2 MiB: several trimmer ticks with nothing
    left to do); return the peaks (VmHWM). Bounded by DEADLINE. Whether what it settled at is
    the trim level is the caller's check (one explicit trim then)."""
    peaks = {pid: peak_rss(pid) for pid in pids}
    for pid in pids:
        assert peaks[pid] - base[pid] > 100 * MiB, (
            f"{what}: the bursts did not grow worker {pid} (base {base[pid] / MiB:.0f} MiB,"
            f" peak {peaks[pid] / MiB:.0f} MiB)"
        )
    trail: dict[int, list[int]] = {pid: [] for pid in pids}
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        for pid in pids:
            trail[pid].append(bench_servers.statm_rss(pid) or 0)

        def done(pid: int) -> bool:
            t = trail[pid][-7:]
            return len(t) == 7 and t[-1] < peaks[pid] - 16 * MiB and max(t) - min(t) < 2 * MiB

        if all(done(pid) for pid in pids):
            return peaks
        time.sleep(0.5)
    lines = [
        f"worker {pid}: base {base[pid] >> 20} MiB, peak {peaks[pid] >> 20} MiB,"
        f" trail {[v >> 20 for v in trail[pid][-12:]]}"
        for pid in pids
    ]
    tail = "\n".join(log.read_text().splitlines()[-40:])
    pytest.fail(
        f"{what}: bursts not given back within {DEADLINE:g} s\n" + "\n".join(lines) + "\n" + tail
    )


def reachable_bound(reachable: int) -> float:
    """What the documented hooks reach: one explicit trim's level, within 15 % or 16 MiB
    (tests/test_servers.py's bound for every recipe)."""
    return max(1.15 * reachable, reachable + 16 * MiB)


def check_levels(
    what: str, pids: list[int], base: dict[int, int], peaks: dict[int, int],
    end: dict[int, int], reachable: dict[int, int],
) -> str:
    figures = "; ".join(
        f"{pid}: base {base[pid] >> 20}, peak {peaks[pid] >> 20}, end {end[pid] >> 20},"
        f" reachable {reachable.get(pid, 0) >> 20} MiB"
        for pid in pids
    )
    for pid in pids:
        assert pid in reachable, f"{what}: worker {pid} never answered /trim ({figures})"
        assert end[pid] <= reachable_bound(reachable[pid]), f"{what}: {figures}"
    return figures


def burst_http(port: int, pids: list[int], log: Path) -> dict[int, int]:
    """Rounds of 12 concurrent /burst requests until every worker served two (at most 6)."""
    served = dict.fromkeys(pids, 0)
    seed = 0
    for _ in range(6):
        with ThreadPoolExecutor(12) as pool:
            seeds = range(seed, seed + 12)
            replies = pool.map(lambda i: bench_servers.get(port, f"/burst?{i}"), seeds)
            answers = [reply["pid"] for reply in replies]
        seed += 12
        for pid in answers:
            assert pid in served, f"an answer from {pid}, not a worker {pids}:\n{log.read_text()}"
            served[pid] += 1
        if min(served.values()) >= 2:
            return served
    pytest.fail(f"6 rounds of 12 requests did not reach every worker twice: {served}")


def ask_each(port: int, pids: list[int], path: str) -> dict[int, dict[str, Any]]:
    """``GET path`` with concurrent requests until every worker answered (bounded rounds)."""
    seen: dict[int, dict[str, Any]] = {}
    for _ in range(30):
        with ThreadPoolExecutor(8) as pool:
            for answer in pool.map(lambda _: bench_servers.get(port, path), range(8)):
                seen.setdefault(answer["pid"], answer)
        if set(pids) <= set(seen):
            break
    return seen


def totals_http(port: int, pids: list[int]) -> dict[int, dict[str, Any]]:
    """Each worker's ``memreclaim.totals()``, asked with concurrent requests (bounded rounds)."""
    seen: dict[int, dict[str, Any]] = {}
    for _ in range(30):
        with ThreadPoolExecutor(8) as pool:
            for answer in pool.map(lambda _: bench_servers.get(port, "/counters"), range(8)):
                seen[answer["pid"]] = answer["totals"]
        if set(pids) <= set(seen):
            break
    return seen


def start(
    argv: list[str], tmp_path: Path, port: int, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    (tmp_path / "app.py").write_text(bench_servers.APP)
    env = {**env, "PYTHONPATH": str(tmp_path), "BENCH_RECIPE": "none", "BENCH_OFFLOAD": "0"}
    env.pop("LD_PRELOAD", None)
    return bench_servers.launch(argv, tmp_path, port, env)


def base_env() -> dict[str, str]:
    names = ("MEMRECLAIM", "MEMRECLAIM_INTERVAL", "MEMRECLAIM_SLACK", "MEMRECLAIM_MIN_INTERVAL")
    return {k: v for k, v in os.environ.items() if k not in (*names, "MEMRECLAIM_LOG")}


def server_argv(server: str, port: int) -> list[str]:
    bind = f"127.0.0.1:{port}"
    if server == "gunicorn-sync":
        return ["gunicorn", "-w", "2", "-b", bind, "--timeout", "120", "app:wsgi_app"]
    if server == "gunicorn-gthread":
        return ["gunicorn", "-w", "2", "-k", "gthread", "--threads", "4", "-b", bind,
                "--timeout", "120", "app:wsgi_app"]  # fmt: skip
    assert server == "uvicorn-workers"
    return ["uvicorn", "app:asgi_app", "--workers", "2", "--host", "127.0.0.1", "--port",
            str(port), "--log-level", "warning"]  # fmt: skip


@pytest.mark.parametrize(
    ("how", "server"),
    [
        ("run", "gunicorn-sync"),
        ("run", "gunicorn-gthread"),
        ("run", "uvicorn-workers"),
        ("env", "gunicorn-sync"),
        ("env", "uvicorn-workers"),
    ],
)
def test_every_worker_gives_its_burst_back(tmp_path: Path, how: str, server: str) -> None:
    pytest.importorskip(server.split("-")[0])
    port = bench_servers.free_port()
    env = {**base_env(), "MEMRECLAIM_LOG": "info"}  # each process's trims, in server.log
    if how == "run":
        argv = [*RUN, *server_argv(server, port)]
    else:
        argv = [sys.executable, "-m", *server_argv(server, port)]
        env["MEMRECLAIM"] = "1"
    log = tmp_path / "server.log"
    proc = start(argv, tmp_path, port, env)
    try:
        pids = wait_for_workers(proc.pid, WORKERS, log)
        base = settle(pids)
        served = burst_http(port, pids, log)
        peaks = settled_after_burst(pids, base, f"{how} {server}", log)
        end = {pid: bench_servers.statm_rss(pid) or 0 for pid in pids}
        totals = totals_http(port, pids)
        reachable = {pid: a["rss"] for pid, a in ask_each(port, pids, "/trim").items()}
    finally:
        stopped = stop(proc)
    figures = check_levels(f"{how} {server}", pids, base, peaks, end, reachable)
    for pid in pids:
        assert pid in totals, f"worker {pid} never answered /counters: {totals}"
        assert totals[pid]["trims"] >= 1, f"worker {pid} made no trim: {totals[pid]} {figures}"
    text = log.read_text()
    assert "Traceback" not in text, text
    if how == "run" and server.startswith("gunicorn"):
        # each forked worker returns through run's frames and prints its own line at exit
        assert stopped, f"gunicorn did not stop on SIGTERM:\n{text}"
        for pid in pids:
            match = re.search(rf"memreclaim run \(forked process {pid}\): .*?; (\d+) trim", text)
            assert match and int(match[1]) >= 1, f"no exit line with trims for {pid}:\n{text}"
    print(f"{how} {server}: served {served}; (base, peak, end) {figures}")


def test_control_without_memreclaim_the_bursts_stay(tmp_path: Path) -> None:
    """The same bursts under plain gunicorn: the workers stay above the bound (the test above
    can fail). Checked over a bounded wait as long as the others' typical give-back."""
    pytest.importorskip("gunicorn")
    port = bench_servers.free_port()
    argv = [sys.executable, "-m", *server_argv("gunicorn-sync", port)]
    proc = start(argv, tmp_path, port, base_env())
    log = tmp_path / "server.log"
    try:
        pids = wait_for_workers(proc.pid, WORKERS, log)
        settle(pids)
        burst_http(port, pids, log)
        time.sleep(5)  # several trimmer intervals' worth: nothing here would trim
        end = {pid: bench_servers.statm_rss(pid) or 0 for pid in pids}
        totals = totals_http(port, pids)
        reachable = {pid: a["rss"] for pid, a in ask_each(port, pids, "/trim").items()}
    finally:
        stop(proc)
    for pid in pids:
        assert totals.get(pid, {"trims": 0})["trims"] == 0
        assert pid in reachable, f"worker {pid} never answered /trim"
        assert end[pid] > reachable_bound(reachable[pid]), (
            f"worker {pid} was at its trim level with nothing running: end {end[pid] >> 20},"
            f" reachable {reachable[pid] >> 20} MiB"
        )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, within: float = 60.0) -> bool:
    """Signal the server's session and wait (bounded); SIGKILL after ``within``. True: it
    stopped on the signal."""
    if proc.poll() is not None:
        return True
    os.killpg(proc.pid, sig)
    try:
        proc.wait(within)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(20)
        return False


# ---- Celery prefork -------------------------------------------------------------------------

CELERY_APP = textwrap.dedent(
    '''
    """A Celery app with no memreclaim code: `memreclaim run` / MEMRECLAIM=1 does the work."""
    import json, os, time
    from celery import Celery
    import memreclaim
    from memreclaim import workloads

    BROKER = os.environ["TEST_BROKER_DIR"]
    OUT = os.environ["TEST_OUT_DIR"]
    app = Celery("proj")
    app.conf.update(
        broker_url="filesystem://",
        broker_transport_options={"data_folder_in": BROKER, "data_folder_out": BROKER,
                                  "control_folder": BROKER, "polling_interval": 0.1},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        worker_enable_remote_control=False,
    )
    KEPT = []

    def report(name, **extra):
        figures = {"pid": os.getpid(), "rss": memreclaim.rss(),
                   "totals": memreclaim.asdict(memreclaim.totals()), **extra}
        with open(os.path.join(OUT, name + ".tmp"), "w") as out:
            json.dump(figures, out)
        os.rename(os.path.join(OUT, name + ".tmp"), os.path.join(OUT, name + ".json"))

    @app.task
    def burst(name, seed):
        data = workloads.strings(60_000, seed=seed, largest=3000)
        KEPT.append(workloads.keep_every(data, 50))
        del data
        report(name)

    @app.task
    def probe(name):
        time.sleep(0.3)  # so that the probes spread over the pool
        figures = {"totals": memreclaim.asdict(memreclaim.totals())}  # before this trim
        report(name, trimmed=memreclaim.trim().rss_after, **figures)
    '''
)


def celery_results(
    out: Path, names: list[str], proc: subprocess.Popen[bytes], log: Path
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all((out / f"{name}.json").exists() for name in names):
            return [json.loads((out / f"{name}.json").read_text()) for name in names]
        assert proc.poll() is None, f"the worker exited:\n{log.read_text()}"
        time.sleep(0.2)
    pytest.fail(f"tasks not done within 120 s:\n{log.read_text()}")


@pytest.mark.parametrize("how", ["run", "env"])
def test_celery_prefork_pool_processes_give_their_burst_back(tmp_path: Path, how: str) -> None:
    pytest.importorskip("celery")
    broker, out = tmp_path / "broker", tmp_path / "out"
    broker.mkdir()
    out.mkdir()
    (tmp_path / "proj.py").write_text(CELERY_APP)
    env = {**base_env(), "MEMRECLAIM_LOG": "info"}
    env.update(PYTHONPATH=str(tmp_path), TEST_BROKER_DIR=str(broker), TEST_OUT_DIR=str(out))
    env.pop("LD_PRELOAD", None)
    worker = ["celery", "-A", "proj", "worker", "--pool=prefork", f"--concurrency={WORKERS}",
              "-O", "fair", "--loglevel=warning", "--without-heartbeat", "--without-gossip",
              "--without-mingle"]  # fmt: skip
    if how == "run":
        argv = [*RUN, *worker]
    else:
        argv = [sys.executable, "-m", *worker]
        env["MEMRECLAIM"] = "1"
    log = tmp_path / "worker.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    sys.path.insert(0, str(tmp_path))
    saved = {k: os.environ.get(k) for k in ("TEST_BROKER_DIR", "TEST_OUT_DIR")}
    os.environ.update(TEST_BROKER_DIR=str(broker), TEST_OUT_DIR=str(out))
    try:
        import proj  # the producer side, in this process (publishes into the broker folder)

        pids = wait_for_workers(proc.pid, WORKERS, log)
        base = settle(pids)
        served = dict.fromkeys(pids, 0)
        for round_ in range(6):
            names = [f"burst-{round_}-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
            for i, name in enumerate(names):
                proj.burst.delay(name, round_ * 12 + i)
            for result in celery_results(out, names, proc, log):
                assert result["pid"] in served, f"a task ran in {result['pid']}, not in {pids}"
                served[result["pid"]] += 1
            if min(served.values()) >= 2:
                break
        else:
            pytest.fail(f"6 rounds of 12 tasks did not reach every pool process twice: {served}")
        peaks = settled_after_burst(pids, base, f"{how} celery prefork", log)
        end = {pid: bench_servers.statm_rss(pid) or 0 for pid in pids}
        totals: dict[int, dict[str, Any]] = {}
        reachable: dict[int, int] = {}
        for _ in range(10):  # probes until each pool process answered (bounded)
            names = [f"probe-{uuid.uuid4().hex[:8]}" for _ in range(4)]
            for name in names:
                proj.probe.delay(name)
            for result in celery_results(out, names, proc, log):
                totals.setdefault(result["pid"], result["totals"])
                reachable.setdefault(result["pid"], result["trimmed"])
            if set(pids) <= set(totals):
                break
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("proj", None)
        stop(proc)
    figures = check_levels(f"{how} celery prefork", pids, base, peaks, end, reachable)
    for pid in pids:
        assert pid in totals, f"pool process {pid} never ran a probe: {totals}"
        assert totals[pid]["trims"] >= 1, f"pool process {pid} made no trim: {figures}"
    print(f"{how} celery: served {served}; (base, peak, end) {figures}")
