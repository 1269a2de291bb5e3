"""Real-server benchmark: does every runner and recipe give a burst back within seconds?

uvicorn (handlers on the loop, and offloaded to a thread) and gunicorn (sync, and gthread with 4
threads) are started as subprocesses on 127.0.0.1 with the app below. The client sends a burst
of 12 concurrent requests, each building 60,000 rows with a 600-3,000 B string and keeping every
50th (``memreclaim.workloads.strings`` + ``keep_every``), all at once or spread over a few
seconds, then light traffic (one new connection every ~50 ms, at most ``--light`` seconds),
while a sampler reads the worker's RSS from /proc/<pid>/statm every 0.1 s.

Per server set-up and recipe it reports RSS at +1/+5/+30 s after the burst against the
*reachable* level (the larger of: the per-request ``malloc_trim`` recipe's RSS at +5 s in the
same set-up, and one explicit trim at the end of the run), the trims, the unproductive trims in
the 30 s after the burst, and the max latency of the light requests that overlapped a trim.

    .venv/bin/python benchmarks/bench_servers.py                  # every set-up and recipe
    .venv/bin/python benchmarks/bench_servers.py --only uvicorn-offload --spread 4
    .venv/bin/python benchmarks/bench_servers.py --record tests/data/uvicorn-offload-spread.json
    .venv/bin/python benchmarks/bench_servers.py --guide --runs 2   # docs/integrations.md's app

``--guide`` runs the FastAPI app of docs/integrations.md (read from the page) under uvicorn and
under gunicorn with ``uvicorn_worker.UvicornWorker``: a burst of 12 concurrent requests to its
``async def`` endpoint or to its ``def`` one, the level the lifespan's watchdog ends at against
one explicit trim in the same worker, the trims its /metrics shows, and how long SIGINT and
SIGTERM take to stop the server (the guide's stop-time figures; tests/test_servers_guide.py
asserts the memory, never the time).

Results: docs/benchmarks/servers.md. Timings here are from a shared, loaded machine: read them
side by side within one run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"

APP = textwrap.dedent(
    '''
    """The benchmark's app: WSGI ``wsgi_app`` and ASGI ``asgi_app``; the recipe from the env."""
    import asyncio, json, os, threading, time
    import memreclaim
    from memreclaim import workloads

    RECIPE = os.environ.get("BENCH_RECIPE", "none")
    OFFLOAD = os.environ.get("BENCH_OFFLOAD") == "1"
    RECORD = os.environ.get("BENCH_RECORD") == "1"
    KEPT = []
    TRIMS = []          # (wall end, seconds, released, productive)
    RUNNER = None

    def on_trim(event):
        TRIMS.append((time.time(), event.seconds, event.released, event.productive))

    def burst(seed):
        data = workloads.strings(60_000, seed=seed, largest=3000)
        KEPT.append(workloads.keep_every(data, 50))
        del data

    def body(path, query):
        if path == "/burst":
            burst(int(query or 0))
        elif path == "/trim":
            result = memreclaim.trim()
            return {"pid": os.getpid(), "rss": result.rss_after}
        elif path == "/counters":
            counters = None if RUNNER is None else RUNNER.counters.__dict__
            return {"pid": os.getpid(), "rss": memreclaim.rss(), "trims": TRIMS,
                    "counters": counters, "record": RECORDED,
                    "totals": memreclaim.asdict(memreclaim.totals())}
        return {"pid": os.getpid(), "rss": memreclaim.rss()}

    RECORDED = []

    def recorder(runner):
        # samples the policy's inputs for tests/data: (wall, rss, in_flight, free)
        while True:
            time.sleep(0.25)
            RECORDED.append((time.time(), memreclaim.rss(), runner.in_flight,
                             memreclaim.heap_stats().free))

    # ---- WSGI (gunicorn) ----
    def wsgi_app(environ, start_response):
        result = body(environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
        data = json.dumps(result).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(data)))])
        if RECIPE == "per-request":
            memreclaim.trim()
        return [data]

    # ---- ASGI (uvicorn) ----
    async def inner(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, query = scope["path"], scope.get("query_string", b"").decode()
        if OFFLOAD:
            result = await asyncio.to_thread(body, path, query)
        else:
            result = body(path, query)
        data = json.dumps(result).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})
        if RECIPE == "per-request":
            await asyncio.to_thread(memreclaim.trim)

    asgi_app = inner
    if RECIPE == "middleware":
        from memreclaim.integrations.asgi import WatchdogMiddleware
        asgi_app = WatchdogMiddleware(inner, on_trim=on_trim)
        RUNNER = asgi_app.watchdog
        if RECORD:
            threading.Thread(target=recorder, args=(RUNNER,), daemon=True).start()
    elif RECIPE == "watchdog":
        from memreclaim.integrations.asgi import watchdog_lifespan
        _lifespan = watchdog_lifespan(on_trim=on_trim)
        RUNNER = _lifespan.watchdog

        async def asgi_app(scope, receive, send):
            if scope["type"] == "lifespan":
                await receive()
                async with _lifespan(None):
                    await send({"type": "lifespan.startup.complete"})
                    await receive()
                await send({"type": "lifespan.shutdown.complete"})
                return
            await inner(scope, receive, send)
    elif RECIPE == "trimmer":
        RUNNER = memreclaim.BackgroundTrimmer(on_trim=on_trim)
        RUNNER.start()
    '''
)

GUNICORN_CONF = textwrap.dedent(
    """
    import app
    from memreclaim.integrations.gunicorn import make_hooks

    _memreclaim = make_hooks(on_trim=app.on_trim{extra})
    app.RUNNER = _memreclaim.trimmer
    post_fork = _memreclaim.post_fork
    worker_exit = _memreclaim.worker_exit
    pre_request = _memreclaim.pre_request
    post_request = _memreclaim.post_request
    """
)

# set-up -> (server, recipes)
SETUPS: dict[str, tuple[str, list[str]]] = {
    "uvicorn-loop": ("uvicorn", ["per-request", "watchdog", "middleware", "trimmer"]),
    "uvicorn-offload": ("uvicorn", ["per-request", "watchdog", "middleware", "trimmer"]),
    "gunicorn-sync": ("gunicorn", ["per-request", "hooks"]),
    "gunicorn-gthread": ("gunicorn", ["per-request", "hooks", "hooks-thresholds"]),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def statm_rss(pid: int) -> int | None:
    """The resident size of process ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


def get(port: int, path: str, timeout: float = 120.0) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(get_text(port, path, timeout))
    return result


def server_argv(setup: str, recipe: str, port: int, workdir: Path) -> list[str]:
    """The command line of a set-up (writes the gunicorn config into ``workdir``)."""
    if setup.startswith("uvicorn"):
        return [
            sys.executable, "-m", "uvicorn", "app:asgi_app", "--host", "127.0.0.1",
            "--port", str(port), "--lifespan", "on", "--log-level", "warning",
        ]  # fmt: skip
    argv = [sys.executable, "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}"]
    argv += ["--timeout", "120", "--backlog", "64"]
    if setup == "gunicorn-gthread":
        argv += ["-k", "gthread", "--threads", "4"]
    if recipe.startswith("hooks"):
        extra = ", thresholds=True" if recipe == "hooks-thresholds" else ""
        (workdir / "conf_bench.py").write_text(GUNICORN_CONF.format(extra=extra))
        argv += ["-c", "conf_bench.py"]
    return [*argv, "app:wsgi_app"]


def launch(
    argv: list[str], workdir: Path, port: int, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a server process (its own session, output in ``workdir/server.log``) and wait until
    it answers ``GET /`` on ``port``; stop it and raise RuntimeError with its log if it exits or
    does not answer within a minute. Shared with tests/test_integrations.py."""
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 60
    while True:
        try:
            get(port, "/", timeout=5)
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_server(proc)
                state = "exited" if proc.returncode is not None else "did not answer in 60 s"
                raise RuntimeError(
                    f"{' '.join(argv)}: {state}:\n{(workdir / 'server.log').read_text()}"
                ) from None
            time.sleep(0.1)


def start_server(
    setup: str, recipe: str, workdir: Path, record: bool = False
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the server for ``setup``/``recipe`` in ``workdir``; return it and its port."""
    (workdir / "app.py").write_text(APP)
    port = free_port()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["BENCH_RECIPE"] = recipe
    env["BENCH_OFFLOAD"] = "1" if setup == "uvicorn-offload" else "0"
    env["BENCH_RECORD"] = "1" if record else "0"
    env["PYTHONPATH"] = str(workdir) + os.pathsep + env.get("PYTHONPATH", "")
    return launch(server_argv(setup, recipe, port, workdir), workdir, port, env), port


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's session, SIGKILL if it is still there 20 s later."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(20)


def send_burst(port: int, spread: float, count: int = 12) -> tuple[float, float, int]:
    """``count`` concurrent /burst requests, starting ``spread / count`` s apart.

    Returns (wall start, wall end, worker pid)."""
    start = time.time()

    def one(i: int) -> int:
        time.sleep(i * spread / count)
        pid: int = get(port, f"/burst?{i}")["pid"]
        return pid

    with ThreadPoolExecutor(count) as pool:
        pids = list(pool.map(one, range(count)))
    return start, time.time(), pids[-1]


def light_traffic(port: int, seconds: float, max_requests: int = 1000) -> list[tuple[float, float]]:
    """One new connection every ~50 ms for ``seconds`` (bounded); (wall start, wall end) each."""
    spans = []
    until = time.monotonic() + seconds
    for _ in range(max_requests):
        if time.monotonic() >= until:
            break
        began = time.time()
        get(port, "/ping")
        spans.append((began, time.time()))
        time.sleep(0.05)
    return spans


def run_once(
    setup: str, recipe: str, spread: float, light: float, record: bool = False
) -> dict[str, Any]:
    """One server run: burst, light traffic, explicit trim; RSS trail and trims."""
    with tempfile.TemporaryDirectory(prefix="bench-servers-") as tmp:
        workdir = Path(tmp)
        proc, port = start_server(setup, recipe, workdir, record)
        try:
            pid = get(port, "/ping")["pid"]
            base = statm_rss(pid) or 0
            trail: list[tuple[float, int]] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.1):
                    value = statm_rss(pid)
                    if value is not None:
                        trail.append((time.time(), value))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            burst_start, burst_end, burst_pid = send_burst(port, spread)
            assert burst_pid == pid, "one worker expected"
            spans = light_traffic(port, light)
            stop.set()
            sampler.join()
            counters = get(port, "/counters")
            reachable_trim = get(port, "/trim")["rss"]
        finally:
            stop_server(proc)
    return {
        "setup": setup,
        "recipe": recipe,
        "spread": spread,
        "base": base,
        "trail": trail,
        "burst_start": burst_start,
        "burst_end": burst_end,
        "spans": spans,
        "trims": counters["trims"],
        "record": counters["record"],
        "explicit_trim": reachable_trim,
    }


def rss_at(run: dict[str, Any], after: float) -> int:
    """RSS sampled nearest to ``after`` seconds past the burst's end."""
    target = run["burst_end"] + after
    return min(run["trail"], key=lambda sample: abs(sample[0] - target))[1]  # type: ignore[no-any-return]


def summarise(run: dict[str, Any], reachable: int) -> dict[str, Any]:
    """The table row of one run."""
    end = run["burst_end"]
    trims = run["trims"]
    after = [t for t in trims if end <= t[0] <= end + 30]
    windows = [(t[0] - t[1], t[0]) for t in trims]
    overlapping = [
        b - a
        for a, b in run["spans"]
        if any(a < w_end and b > w_start for w_start, w_end in windows)
    ]
    at5 = rss_at(run, 5)
    return {
        "setup": run["setup"],
        "recipe": run["recipe"],
        "spread": run["spread"],
        "peak_mib": round(max(v for _, v in run["trail"]) / MiB, 1),
        "rss1_mib": round(rss_at(run, 1) / MiB, 1),
        "rss5_mib": round(at5 / MiB, 1),
        "rss30_mib": round(rss_at(run, 30) / MiB, 1),
        "reachable_mib": round(reachable / MiB, 1),
        "ok5": at5 <= max(reachable * 1.15, reachable + 16 * MiB),
        "trims": len(trims),
        "unproductive_after": sum(1 for t in after if not t[3]),
        "max_overlap_ms": round(1000 * max(overlapping), 1) if overlapping else None,
        "max_trim_ms": round(1000 * max(t[1] for t in trims), 1) if trims else None,
    }


# ---- the guide's FastAPI app (docs/integrations.md) -----------------------------------------

GUIDE_TEST_ROUTES = textwrap.dedent(
    """

    # ---- test-only routes, appended to the guide's app by benchmarks/bench_servers.py ----
    @app.get("/")
    async def _root() -> dict[str, int]:
        return {"pid": os.getpid(), "rss": memreclaim.rss()}


    @app.get("/trim")
    async def _trim() -> dict[str, object]:
        return {"pid": os.getpid(), "rss": memreclaim.trim().rss_after}
    """
)


def guide_app(path: Path = GUIDE) -> str:
    """The guide's app: the Python block of ``path`` whose first line is ``# app.py``."""
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)
    for block in blocks:
        if block.startswith("# app.py\n"):
            return str(block)
    raise LookupError(f"no Python block starting with '# app.py' in {path}")


def get_text(port: int, path: str, timeout: float = 60.0) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {response.status}")
        return data.decode()
    finally:
        conn.close()


def metric(text: str, name: str) -> float | None:
    """The value of an unlabelled sample ``name`` in Prometheus text, or None."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match[1]) if match else None


def guide_argv(server: str, port: int) -> list[str]:
    """The guide's command lines (1 worker, so the one worker takes the whole burst)."""
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning"]  # fmt: skip
    return [sys.executable, "-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker", "-w", "1",
            "-b", f"127.0.0.1:{port}", "--timeout", "120", "app:app"]  # fmt: skip


def guide_run(
    server: str, kind: str, workdir: Path, stop_signal: int, deadline: float = 60.0
) -> dict[str, Any]:
    """One run of the guide's app: burst on the ``kind`` ("async"/"sync") endpoint, wait for the
    watchdog's trim and a flat RSS (bounded), /metrics, one explicit trim, then ``stop_signal``
    (SIGINT to the session, as a terminal's Ctrl-C; SIGTERM to the server process, as a
    container runtime) and the seconds it took to exit (SIGKILL after 30 s)."""
    (workdir / "app.py").write_text(guide_app() + GUIDE_TEST_ROUTES)
    port = free_port()
    names = ("MEMRECLAIM", "MEMRECLAIM_INTERVAL", "MEMRECLAIM_SLACK", "MEMRECLAIM_MIN_INTERVAL")
    env = {k: v for k, v in os.environ.items() if k not in (*names, "MEMRECLAIM_LOG")}
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = str(workdir) + os.pathsep + env.get("PYTHONPATH", "")
    proc = launch(guide_argv(server, port), workdir, port, env)
    stopped_in: float | None = None
    try:
        pid = get(port, "/")["pid"]
        time.sleep(1.0)
        base = statm_rss(pid) or 0
        before = get(port, "/memreclaim")["trims"]
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda i: get(port, f"/build-{kind}?seed={i}"), range(12)))
        assert {a["pid"] for a in answers} == {pid}, "one worker expected"
        with open(f"/proc/{pid}/status") as f:
            peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        trail: list[int] = []
        counters: dict[str, Any] = {}
        settled = False
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            time.sleep(0.5)
            trail.append(statm_rss(pid) or 0)
            counters = get(port, "/memreclaim")
            if (
                counters["trims"] > before
                and len(trail) >= 3
                and (abs(trail[-1] - trail[-3]) < 2 * MiB)
            ):
                settled = True
                break
        end = statm_rss(pid) or 0
        metrics = get_text(port, "/metrics/")
        reachable = get(port, "/trim")["rss"]
    finally:
        began = time.monotonic()
        if proc.poll() is None:
            if stop_signal == signal.SIGINT:
                os.killpg(proc.pid, signal.SIGINT)
            else:
                os.kill(proc.pid, stop_signal)
            try:
                proc.wait(30)
                stopped_in = time.monotonic() - began
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(20)
    return {
        "server": server,
        "kind": kind,
        "signal": signal.Signals(stop_signal).name,
        "base": base,
        "peak": peak,
        "end": end,
        "reachable": reachable,
        "settled": settled,
        "trail_mib": [v >> 20 for v in trail],
        "watchdog_trims": counters.get("trims"),
        "metrics_trims": metric(metrics, "memreclaim_trims_total"),
        "metrics_released": metric(metrics, "memreclaim_released_bytes_total"),
        "stopped_in": stopped_in,
        "returncode": proc.returncode,
        "log": (workdir / "server.log").read_text(),
    }


def guide_rows(runs: int) -> list[dict[str, Any]]:
    rows = []
    for server in ("uvicorn", "gunicorn"):
        for kind in ("async", "sync"):
            for i in range(runs):
                sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
                with tempfile.TemporaryDirectory(prefix="bench-guide-") as tmp:
                    run = guide_run(server, kind, Path(tmp), sig)
                row = {
                    key: round(run[key] / MiB, 1)
                    if key in ("base", "peak", "end", "reachable")
                    else run[key]
                    for key in run
                    if key not in ("log", "trail_mib")
                }
                if row["stopped_in"] is not None:
                    row["stopped_in"] = round(row["stopped_in"], 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SETUPS), help="set-up(s)")
    parser.add_argument("--recipe", action="append", help="recipe(s) (per-request always runs)")
    parser.add_argument(
        "--spread", type=float, action="append", help="burst spread, s (default: 0 and 4)"
    )
    parser.add_argument("--light", type=float, default=32.0, help="seconds of light traffic")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--record", type=Path, help="record a policy trace (uvicorn-offload)")
    parser.add_argument("--guide", action="store_true", help="docs/integrations.md's app")
    parser.add_argument("--runs", type=int, default=2, help="--guide: runs per row (2)")
    args = parser.parse_args()
    if args.guide:
        print(f"load: {os.getloadavg()}", flush=True)
        rows = guide_rows(args.runs)
        print(f"load: {os.getloadavg()}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    if args.record:
        run = run_once("uvicorn-offload", "middleware", 4.0, args.light, record=True)
        trace = {
            "source": "benchmarks/bench_servers.py --record: uvicorn, offloaded handlers,"
            " WatchdogMiddleware at its defaults, 12 requests spread over 4 s",
            "burst_start": run["burst_start"],
            "burst_end": run["burst_end"],
            "samples": run["record"],
            "trims": [[t[0], None] for t in run["trims"]],
            "policy": {},
        }
        # RSS right after each recorded trim: the first recorded sample after its end
        for trim in trace["trims"]:
            later = [s[1] for s in run["record"] if s[0] >= trim[0]]
            trim[1] = later[0] if later else run["record"][-1][1]
        args.record.write_text(json.dumps(trace))
        print(f"recorded {len(run['record'])} samples, {len(run['trims'])} trims -> {args.record}")
        return 0
    print(f"load: {os.getloadavg()}", flush=True)
    rows = []
    for setup in args.only or list(SETUPS):
        _, recipes = SETUPS[setup]
        chosen = [r for r in recipes if r == "per-request" or not args.recipe or r in args.recipe]
        for spread in args.spread or [0.0, 4.0]:
            runs = [run_once(setup, recipe, spread, args.light) for recipe in chosen]
            baseline = next(r for r in runs if r["recipe"] == "per-request")
            reachable = max(rss_at(baseline, 5), baseline["explicit_trim"])
            for run in runs:
                row = summarise(run, reachable)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"load: {os.getloadavg()}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
