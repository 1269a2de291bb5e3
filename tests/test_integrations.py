"""Tests of memreclaim.integrations against real servers (gunicorn, uvicorn) on 127.0.0.1.

Each server runs in its own process with the seed-000 spike behind an HTTP endpoint; the test
reads the worker's RSS from /proc/PID/statm every 0.1 s until it falls back, with an overall
deadline (nothing timed is asserted: how fast is benchmarks/bench_servers.py's business). A
control run without the hooks shows the memory stays. Starting and stopping a server is
bench_servers.launch/stop_server, shared with the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bench_servers
import pytest
from conftest import peak_rss

import memreclaim
from memreclaim.integrations.asgi import WatchdogMiddleware, watchdog_lifespan
from memreclaim.integrations.celery import CeleryTrimming, install
from memreclaim.integrations.gunicorn import make_hooks
from memreclaim.watchdog import BackgroundTrimmer, Watchdog

MiB = 2**20
DEADLINE = 60.0  # for a server to give a spike back, on a loaded machine

glibc_only = pytest.mark.skipif(
    memreclaim.allocator() != "glibc", reason="the retained-spike shape is glibc's"
)

SPIKE = textwrap.dedent(
    """
    import gc, json, os
    import memreclaim
    from memreclaim import workloads

    KEPT = []

    def spike():
        data = workloads.strings()
        KEPT.append(workloads.keep_every(data, 50))
        del data
        gc.collect()

    def info(**extra):
        return json.dumps({"pid": os.getpid(), "rss": memreclaim.rss(), **extra}).encode()
    """
)

WSGI_APP = SPIKE + textwrap.dedent(
    """
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/spike":
            spike()
        body = info()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]
    """
)

STARLETTE_APP = SPIKE + textwrap.dedent(
    """
    from dataclasses import asdict
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route
    from memreclaim.integrations.asgi import watchdog_lifespan

    async def root(request):
        return Response(info(), media_type="application/json")

    async def do_spike(request):
        spike()                      # on the loop, like a CPU-heavy async handler
        return Response(info(), media_type="application/json")

    async def counters(request):
        wd = request.state.memreclaim_watchdog
        return Response(info(counters=asdict(wd.counters)), media_type="application/json")

    app = Starlette(
        routes=[Route("/", root), Route("/spike", do_spike), Route("/counters", counters)],
        lifespan=watchdog_lifespan(interval=0.1, slack="64 MiB", min_interval=0.1,
                                   long_quiet=0.1),
    )
    """
)

RAW_ASGI_APP = SPIKE + textwrap.dedent(
    """
    from memreclaim.integrations.asgi import WatchdogMiddleware

    async def inner(scope, receive, send):
        if scope["type"] == "lifespan":          # an app that ignores lifespan events
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/spike":
            spike()
        body = info()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    app = WatchdogMiddleware(inner, interval=0.1, slack="64 MiB", min_interval=0.1,
                             long_quiet=0.1)
    """
)


def get(port: int, path: str) -> dict[str, Any]:
    return bench_servers.get(port, path, timeout=60)


def rss(pid: int) -> int:
    value = bench_servers.statm_rss(pid)
    assert value is not None, f"process {pid} is gone"
    return value


@contextlib.contextmanager
def server(args: list[str], cwd: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server process, wait until it answers on port, and always stop it."""
    proc = bench_servers.launch(args, cwd, port)
    try:
        yield proc
    finally:
        bench_servers.stop_server(proc)


def spike(port: int) -> dict[str, Any]:
    """Baseline, then the spike over HTTP: the worker's pid and RSS figures."""
    base = get(port, "/")
    spiked = get(port, "/spike")
    assert spiked["pid"] == base["pid"], "one worker expected"
    return {
        "base": base["rss"],
        "spiked": spiked["rss"],
        "peak": peak_rss(spiked["pid"]),
        "pid": spiked["pid"],
    }


def given_back(pid: int, level: float, deadline: float = DEADLINE) -> list[int]:
    """Read the worker's RSS every 0.1 s until it is below ``level``; the readings (the last one
    below). Fails with the readings if it is still above after ``deadline`` s."""
    trail = [rss(pid)]
    end = time.monotonic() + deadline
    while trail[-1] >= level:
        if time.monotonic() > end:
            pytest.fail(
                f"RSS of {pid} still above {level / MiB:.0f} MiB after {deadline:g} s "
                f"(MiB: {[value >> 20 for value in trail]})"
            )
        time.sleep(0.1)
        trail.append(rss(pid))
    return trail


def reported_trim(port: int, deadline: float = DEADLINE) -> dict[str, Any]:
    """The watchdog's counters once it has reported a trim. RSS falls while malloc_trim still
    works, before the trim is counted: reading the counters right then saw trims == 0."""
    end = time.monotonic() + deadline
    while True:
        counters: dict[str, Any] = get(port, "/counters")["counters"]
        if counters["trims"] >= 1:
            return counters
        if time.monotonic() > end:
            pytest.fail(f"the watchdog reported no trim within {deadline:g} s: {counters}")
        time.sleep(0.1)


def readings(pid: int, count: int = 20) -> list[int]:
    """``count`` readings of the worker's RSS, 0.1 s apart (the control: nothing gives back)."""
    trail = []
    for _ in range(count):
        time.sleep(0.1)
        trail.append(rss(pid))
    return trail


GUNICORN_CONF = textwrap.dedent(
    """
    from memreclaim.integrations.gunicorn import make_hooks

    _memreclaim = make_hooks(thread={thread}, interval=0.1, slack="64 MiB", min_interval=0.1)
    post_fork = _memreclaim.post_fork
    worker_exit = _memreclaim.worker_exit
    {post_request}
    """
)


def gunicorn_args(port: int, conf: str | None) -> list[str]:
    args = [sys.executable, "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}"]
    if conf:
        args += ["-c", conf]
    return [*args, "--timeout", "60", "app_wsgi:app"]


@glibc_only
@pytest.mark.parametrize(
    "mode",
    ["post_fork-thread", "post_request-only", "no-hooks"],
)
def test_gunicorn_worker_gives_the_spike_back(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("gunicorn")
    (tmp_path / "app_wsgi.py").write_text(WSGI_APP)
    conf = None
    if mode != "no-hooks":
        thread = mode == "post_fork-thread"
        post_request = (
            ""
            if thread
            else "pre_request = _memreclaim.pre_request\npost_request = _memreclaim.post_request"
        )
        (tmp_path / "conf_memreclaim.py").write_text(
            GUNICORN_CONF.format(thread=thread, post_request=post_request)
        )
        conf = "conf_memreclaim.py"
    port = bench_servers.free_port()
    with server(gunicorn_args(port, conf), tmp_path, port):
        watched = spike(port)
        spike_size = watched["peak"] - watched["base"]
        assert spike_size > 300 * MiB, watched
        level = watched["base"] + 0.25 * spike_size
        if mode == "no-hooks":
            # control: without memreclaim the worker keeps the spike (20 readings, 0.1 s apart)
            trail = readings(watched["pid"])
            assert watched["spiked"] - watched["base"] > 0.75 * spike_size, watched
            assert min(trail) > watched["base"] + 0.75 * spike_size, (watched, trail)
        else:
            given_back(watched["pid"], level)


@glibc_only
@pytest.mark.parametrize("app_module", ["starlette", "raw", "raw-no-lifespan"])
def test_uvicorn_app_gives_the_spike_back(tmp_path: Path, app_module: str) -> None:
    pytest.importorskip("uvicorn")
    if app_module == "starlette":
        pytest.importorskip("starlette")
    source = STARLETTE_APP if app_module == "starlette" else RAW_ASGI_APP
    lifespan = "on"
    if app_module == "raw-no-lifespan":
        # an app that fails the lifespan scope under uvicorn's default --lifespan auto: no
        # startup ever arrives, the middleware starts its watchdog at the first request
        source = source.replace(
            'if scope["type"] == "lifespan":',
            'if scope["type"] == "lifespan":\n'
            '        raise ValueError("no lifespan")\n'
            "    if False:",
        )
        lifespan = "auto"
    (tmp_path / "app_asgi.py").write_text(source)
    port = bench_servers.free_port()
    args = [
        sys.executable, "-m", "uvicorn", "app_asgi:app", "--host", "127.0.0.1",
        "--port", str(port), "--lifespan", lifespan, "--log-level", "warning",
    ]  # fmt: skip
    with server(args, tmp_path, port) as proc:
        watched = spike(port)
        spike_size = watched["peak"] - watched["base"]
        assert spike_size > 300 * MiB, watched
        given_back(watched["pid"], watched["base"] + 0.25 * spike_size)
        counters = reported_trim(port) if app_module == "starlette" else None
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        log = (tmp_path / "server.log").read_text()
    if counters is not None:
        assert counters["bytes_released"] > 0.5 * spike_size, counters
    # a clean shutdown: the watchdog stopped with the lifespan (uvicorn re-raises SIGTERM
    # after its graceful shutdown, hence -SIGTERM)
    assert proc.returncode in (0, -signal.SIGTERM), log
    assert "Task was destroyed" not in log, log
    if app_module != "raw-no-lifespan":  # uvicorn logs the lifespan failure it survives
        assert "Traceback" not in log, log


# ---- ASGI helpers without a server ----------------------------------------------------------


async def ticked(watchdog: Watchdog) -> None:
    """Wait (polling, with a deadline) until the running watchdog has ticked at least once."""
    end = time.monotonic() + DEADLINE
    while watchdog.counters.ticks == 0:
        assert time.monotonic() < end, f"the watchdog did not tick in {DEADLINE:g} s"
        await asyncio.sleep(0.005)


def test_watchdog_lifespan_runs_inner_and_merges_state() -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def inner(app: Any) -> Any:
        events.append("inner-start")
        yield {"db": "connection"}
        events.append("inner-stop")

    lifespan = watchdog_lifespan(inner, interval=0.005)
    watchdog: Watchdog = lifespan.watchdog  # type: ignore[attr-defined]

    async def main() -> None:
        async with lifespan(object()) as state:
            assert state["db"] == "connection"
            assert state["memreclaim_watchdog"] is watchdog
            assert watchdog.running
            await ticked(watchdog)
        assert not watchdog.running

    asyncio.run(main())
    assert events == ["inner-start", "inner-stop"]
    assert watchdog.counters.ticks > 0


def test_asgi_helpers_bad_arguments() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        watchdog_lifespan(interval=0)
    with pytest.raises(TypeError, match="inner must be a lifespan callable"):
        watchdog_lifespan(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="app must be an ASGI callable"):
        WatchdogMiddleware("app")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slack must be > 0"):
        WatchdogMiddleware(lambda s, r, w: None, slack=0)  # type: ignore[arg-type,return-value]


def test_watchdog_middleware_lifespan_protocol() -> None:
    seen: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

    middleware = WatchdogMiddleware(inner, interval=0.005)

    async def main() -> list[str]:
        incoming: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        sent: list[str] = []

        async def send(message: Any) -> None:
            sent.append(message["type"])

        task = asyncio.create_task(middleware({"type": "lifespan"}, incoming.get, send))
        await incoming.put({"type": "lifespan.startup"})
        end = time.monotonic() + DEADLINE
        while "lifespan.startup.complete" not in sent:
            assert time.monotonic() < end, f"no lifespan.startup.complete in {DEADLINE:g} s"
            await asyncio.sleep(0.001)
        assert middleware.watchdog.running
        await ticked(middleware.watchdog)
        await incoming.put({"type": "lifespan.shutdown"})
        await task
        assert not middleware.watchdog.running
        return sent

    sent = asyncio.run(main())
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert seen == ["lifespan.startup", "lifespan.shutdown"]
    assert middleware.watchdog.counters.ticks > 0


# ---- gunicorn hooks without a server --------------------------------------------------------


def test_gunicorn_hooks_bad_arguments() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        make_hooks(interval=-1)
    with pytest.raises(TypeError, match="thread must be a bool"):
        make_hooks(thread="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword"):
        make_hooks(intervall=1)


def test_gunicorn_hooks_validate_in_gunicorn_config() -> None:
    gunicorn_config = pytest.importorskip("gunicorn.config")
    hooks = make_hooks(interval=0.005)
    config = gunicorn_config.Config()
    # gunicorn checks the arity of every hook when it is set
    config.set("post_fork", hooks.post_fork)
    config.set("worker_exit", hooks.worker_exit)
    config.set("post_request", hooks.post_request)
    config.post_fork(None, None)
    try:
        assert hooks.trimmer.running
        config.post_request(None, None, {}, None)
    finally:
        config.worker_exit(None, None)
    assert not hooks.trimmer.running


# ---- Celery --------------------------------------------------------------------------------


def test_celery_handlers_bad_arguments() -> None:
    with pytest.raises(ValueError, match="slack must be > 0"):
        CeleryTrimming(slack=0)
    with pytest.raises(TypeError, match="thread must be a bool"):
        CeleryTrimming(thread=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="main_process must be a bool"):
        install(main_process="no")  # type: ignore[arg-type]


def test_celery_signals_drive_the_trimmer() -> None:
    """Through Celery's real Signal objects (no broker here: signals are sent directly)."""
    signals = pytest.importorskip("celery.signals")
    trimming = install(interval=0.005, slack="8 MiB", min_interval=0.005)
    try:
        signals.worker_process_init.send(sender=None)
        assert trimming.trimmer.running
        blob = b"x" * (64 * MiB)  # live growth, then a task ends
        before = trimming.trimmer.counters.ticks
        signals.task_postrun.send(sender=None, task_id="t", task=None, args=(), kwargs={})
        assert trimming.trimmer.counters.ticks > before
        signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
        assert not trimming.trimmer.running
        del blob
    finally:
        trimming.disconnect()
    # disconnected: the signals no longer reach it
    signals.worker_process_init.send(sender=None)
    assert not trimming.trimmer.running


def test_celery_thread_false_only_checks_after_tasks() -> None:
    trimming = CeleryTrimming(thread=False, slack="8 MiB", min_interval=0.001)
    trimming.on_worker_process_init()
    assert not trimming.trimmer.running
    trimming.on_task_prerun()
    blob = b"x" * (64 * MiB)
    trimming.on_task_postrun()
    assert trimming.trimmer.counters.trims == 1
    del blob


@glibc_only
def test_celery_task_postrun_returns_a_task_spike(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    """A task's spike is given back by the task_postrun check (subprocess, real signals)."""
    pytest.importorskip("celery")
    code = SPIKE + textwrap.dedent(
        """
        from celery import signals
        from memreclaim.integrations.celery import install

        trimming = install(thread=False, slack="64 MiB", min_interval=0.01)
        signals.worker_process_init.send(sender=None)
        base = memreclaim.rss()
        signals.task_prerun.send(sender=None, task_id="t", task=None, args=(), kwargs={})
        spike()                                            # "the task"
        retained = memreclaim.rss()
        signals.task_postrun.send(sender=None, task_id="t", task=None, args=(), kwargs={})
        print("RESULT " + json.dumps({"base": base, "retained": retained,
              "after": memreclaim.rss(), "trims": trimming.trimmer.counters.trims}))
        """
    )
    result = run_python(code, prelude=False)
    spike_size = result["retained"] - result["base"]
    assert spike_size > 300 * MiB, result
    assert result["trims"] == 1, result
    assert result["after"] - result["base"] < 0.25 * spike_size, result


CELERY_APP = SPIKE + textwrap.dedent(
    """
    from celery import Celery, signals
    from memreclaim.integrations.celery import install

    app = Celery("app_celery", broker="memory://")
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    trimming = install(interval=0.1, slack="64 MiB", min_interval=0.1)

    @app.task
    def spike_task():
        base = memreclaim.rss()
        spike()
        with open(os.environ["MEMRECLAIM_TEST_OUT"], "w") as out:
            out.write(info(base=base, trimmer_running=trimming.trimmer.running).decode())

    @signals.worker_ready.connect
    def send_the_task(sender=None, **kwargs):
        # the in-memory broker lives in this (main worker) process: publish from here
        spike_task.delay()
    """
)


@glibc_only
def test_celery_prefork_worker_gives_a_task_spike_back(tmp_path: Path) -> None:
    """A real Celery worker (prefork pool, 1 process) with kombu's in-memory broker."""
    pytest.importorskip("celery")
    (tmp_path / "app_celery.py").write_text(CELERY_APP)
    out = tmp_path / "task.json"
    env = {**os.environ, "MEMRECLAIM_TEST_OUT": str(out)}
    args = [
        sys.executable, "-m", "celery", "-A", "app_celery", "worker", "--pool=prefork",
        "--concurrency=1", "--loglevel=warning", "--without-heartbeat", "--without-gossip",
        "--without-mingle",
    ]  # fmt: skip
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()  # the worker has its own copy
    try:
        end = time.monotonic() + DEADLINE  # for the worker to start and run the task
        while not (out.exists() and out.stat().st_size):
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            if time.monotonic() > end:
                pytest.fail(
                    f"the task did not run within {DEADLINE:g} s:\n"
                    + (tmp_path / "worker.log").read_text()
                )
            time.sleep(0.1)
        task = json.loads(out.read_text())
        pid = task["pid"]
        assert pid != proc.pid  # it ran in the pool process
        spike_size = peak_rss(pid) - task["base"]
        assert task["trimmer_running"] is True  # started by worker_process_init in the pool
        assert spike_size > 300 * MiB, task
        given_back(pid, task["base"] + 0.25 * spike_size)
    finally:
        bench_servers.stop_server(proc)


def test_trimmer_type_is_shared() -> None:
    assert isinstance(make_hooks().trimmer, BackgroundTrimmer)
    assert isinstance(CeleryTrimming().trimmer, BackgroundTrimmer)
