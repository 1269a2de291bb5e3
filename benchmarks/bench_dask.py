"""Dask (and Ray) workers under each way of giving memory back: RSS, pauses, restarts, runs done.

A ``LocalCluster(n_workers=2, threads_per_worker=2, processes=True)`` on loopback, at a memory
limit per worker, runs 16 tasks; each builds 110,000 strings of 600-4,000 bytes
(``memreclaim.workloads.strings``: malloc's memory, in the worker's thread arenas) and returns
every 50th (kept by Dask as managed memory; the rest is freed, and glibc keeps most of it). Two
such tasks at once take a worker past 80 % of 700 MiB, where Dask pauses it; what the allocator
keeps after them stays there unless something trims.

Routes (the ``route`` of :func:`run_once`):

- ``defaults``: Dask as installed (its ``MALLOC_TRIM_THRESHOLD_=65536`` pre-spawn setting);
- ``ctypes``: the Dask docs' recipe, ``client.run(trim_memory)`` with ``ctypes``'s
  ``malloc_trim(0)``, run from the client every 10 s while the work runs and once after it;
- ``plugin``: ``client.register_plugin(MemreclaimPlugin())``;
- ``preload``: ``LocalCluster(preload=["memreclaim.integrations.dask"])``;
- ``environ``: ``MEMRECLAIM=1`` through ``distributed.nanny.pre-spawn-environ``.

Per run and worker: RSS right after the work and 10 s later, Dask's unmanaged memory then
(RSS minus managed), RSS after one explicit ``memreclaim.trim()`` made after that, the pauses
(the worker's status, sampled every 0.25 s, and its "Pausing worker" log lines), the restarts
(a worker pid replaced), whether the run finished within the deadline, and its wall time.
``--ray`` adds a Ray row: 2 CPUs, 8 tasks of the same burst, with and without
``runtime_env={"worker_process_setup_hook": "memreclaim.integrations.ray.setup"}``.

    .venv/bin/python benchmarks/bench_dask.py --runs 3 --ray --write docs/benchmarks/dask.md

Results: docs/benchmarks/dask.md (written by this script with ``--write``). Wall times come from
a shared machine (the load is printed): read them side by side within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
ROUTES = ("defaults", "ctypes", "plugin", "preload", "environ")
LIMITS = ("700MiB", "1.5GiB")
TASKS = 16
COUNT = 110_000
SETTLE = 10.0
QUIET_TICKS = 5
"""A trimmer is quiet when it ticked this many times since its last trim (``settle_deadline``)."""
ROOT = Path(__file__).resolve().parent.parent


def burst(seed: int, count: int = COUNT) -> list[tuple[str, float]]:
    """One task: ``count`` strings built, every 50th kept (returned), the rest freed."""
    from memreclaim import workloads

    data = workloads.strings(count, seed=seed)
    kept = workloads.keep_every(data, 50)
    del data
    return kept


def trim_memory() -> int:
    """The Dask docs' recipe, as they give it."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    return int(libc.malloc_trim(0))


def _trimmer(dask_worker: Any) -> Any:
    """The worker's trimmer: the plugin's (plugin, preload) or the MEMRECLAIM=1 one; or None."""
    plugin = getattr(dask_worker, "plugins", {}).get("memreclaim")
    if plugin is not None and getattr(plugin, "trimmer", None) is not None:
        return plugin.trimmer
    if "memreclaim.runners.autostart" in sys.modules:
        return sys.modules["memreclaim.runners.autostart"].current()
    return None


def worker_figures(dask_worker: Any) -> dict[str, Any]:
    """In a worker (``client.run``): RSS, managed bytes, peak, the trimmer's trims, ticks and
    level, its pid."""
    import memreclaim

    trimmer = _trimmer(dask_worker)
    counters = None if trimmer is None else trimmer.counters
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))
    return {
        "pid": os.getpid(),
        "rss": memreclaim.rss(),
        "managed": int(dask_worker.state.nbytes),
        "peak": peak,
        "trims": None if counters is None else counters.trims,
        "ticks": None if counters is None else counters.ticks,
        "level": None if counters is None else counters.level,
        "floor": None if counters is None else counters.floor,
    }


def explicit_trim(dask_worker: Any) -> int:
    """In a worker: one ``memreclaim.trim()``; RSS after it."""
    import memreclaim

    memreclaim.trim()
    return memreclaim.rss()


def _cluster(route: str, limit: str) -> Any:
    import dask.config
    from distributed import LocalCluster

    kwargs: dict[str, Any] = {}
    if route == "preload":
        kwargs["preload"] = ["memreclaim.integrations.dask"]
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if route == "environ":
        environ["MEMRECLAIM"] = "1"
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        return LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=True,
            memory_limit=limit,
            host="127.0.0.1",
            dashboard_address=":0",
            **kwargs,
        )


def _sample(client: Any, seen: dict[str, Any]) -> None:
    """One status sample: count pauses (a worker newly paused) and addresses seen per name."""
    for address, info in client.scheduler_info(n_workers=-1)["workers"].items():
        name = str(info.get("name"))
        status = info.get("status")
        if status == "paused" and seen["status"].get(name) != "paused":
            seen["pauses"] += 1
        seen["status"][name] = status
        seen["pids"].setdefault(name, set()).add(address)  # a restarted worker: a new one


def run_once(
    route: str,
    limit: str,
    *,
    deadline: float = 120.0,
    tasks: int = TASKS,
    count: int = COUNT,
    settle: float = SETTLE,
    settle_deadline: float | None = None,
) -> dict[str, Any]:
    """One run of the workload under ``route`` at ``limit`` per worker; its figures.

    ``rss_later`` is RSS ``settle`` seconds after the work (the benchmark's figure). With
    ``settle_deadline`` (the tests'), the run then also waits, up to that many seconds, until
    every trimmer is quiet (:data:`QUIET_TICKS` ticks with no trim) and reports RSS then as
    ``rss_settled``, ``quiet`` and the trimmer's figures, before the explicit trim: a bound on
    ticks, not on time, so a loaded machine only makes it slower.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, not {route!r}")
    environ = dict(os.environ)
    try:
        return _run(route, limit, deadline, tasks, count, settle, settle_deadline)
    finally:
        # A LocalCluster's nannies write pre-spawn-environ into this process's own os.environ
        # (distributed 2026.8) and leave it there: MEMRECLAIM=1 would reach the next runs.
        os.environ.clear()
        os.environ.update(environ)


def _quiet(client: Any, seconds: float) -> tuple[dict[str, Any], bool]:
    """Poll the workers until each trimmer ticked :data:`QUIET_TICKS` times with no trim (a
    worker without one is quiet), at most ``seconds``; (the last figures, all quiet)."""
    end = time.monotonic() + seconds
    since: dict[str, tuple[Any, Any]] = {}  # per worker: (trims, ticks) when trims last changed
    while True:
        figures = client.run(worker_figures)
        quiet = True
        for address, figure in figures.items():
            trims, ticks = figure["trims"], figure["ticks"]
            if ticks is None:
                continue
            if address not in since or since[address][0] != trims:
                since[address] = (trims, ticks)
            quiet = quiet and ticks - since[address][1] >= QUIET_TICKS
        if quiet or time.monotonic() >= end:
            return figures, quiet
        time.sleep(0.25)


def _run(
    route: str,
    limit: str,
    deadline: float,
    tasks: int,
    count: int,
    settle: float,
    settle_deadline: float | None = None,
) -> dict[str, Any]:
    from distributed import Client

    started = time.monotonic()
    with _cluster(route, limit) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        if route == "plugin":
            from memreclaim.integrations.dask import MemreclaimPlugin

            client.register_plugin(MemreclaimPlugin())
        seen: dict[str, Any] = {"pauses": 0, "status": {}, "pids": {}}
        work_started = time.monotonic()
        futures = client.map(burst, range(tasks), count=count)
        last_recipe = time.monotonic()
        while time.monotonic() < work_started + deadline:
            if all(f.done() for f in futures):
                break
            _sample(client, seen)
            if route == "ctypes" and time.monotonic() - last_recipe >= 10.0:
                client.run(trim_memory)
                last_recipe = time.monotonic()
            time.sleep(0.25)
        finished = sum(f.status == "finished" for f in futures)
        wall = time.monotonic() - work_started
        client.cancel(futures)
        del futures
        if route == "ctypes":
            client.run(trim_memory)
        after = client.run(worker_figures)
        settle_end = time.monotonic() + settle
        while time.monotonic() < settle_end:
            _sample(client, seen)
            time.sleep(0.25)
        later = client.run(worker_figures)
        settled, quiet = (
            (later, None) if settle_deadline is None else _quiet(client, settle_deadline)
        )
        trimmed = client.run(explicit_trim)
        logs = client.get_worker_logs()
        metrics = {
            address: info["metrics"]
            for address, info in client.scheduler_info(n_workers=-1)["workers"].items()
        }
    log_pauses = sum("Pausing worker" in line for lines in logs.values() for _, line in lines)
    workers = []
    for address, figures in later.items():
        first = after.get(address, figures)
        last = settled.get(address, figures)
        lines = [line for _, line in logs.get(address, [])]
        workers.append(
            {
                "rss_after": first["rss"],
                "address": address,
                "rss_later": figures["rss"],
                "rss_settled": last["rss"],
                "quiet": quiet,
                "trimmer": {key: last[key] for key in ("trims", "ticks", "level", "floor")},
                "unmanaged_later": figures["rss"] - figures["managed"],
                "explicit": trimmed.get(address, figures["rss"]),
                "peak": figures["peak"],
                "trims": figures["trims"],
                "trim_log_lines": sum("memreclaim: trim released" in line for line in lines),
                "scheduler_trims": metrics.get(address, {}).get("memreclaim_trims"),
            }
        )
    trim_lines = sum(w["trim_log_lines"] for w in workers)
    restarts = sum(len(pids) - 1 for pids in seen["pids"].values())
    return {
        "route": route,
        "limit": limit,
        "tasks": tasks,
        "finished": finished,
        "done": finished == tasks,
        "wall": wall,
        "pauses": max(seen["pauses"], log_pauses),
        "restarts": restarts,
        "trim_log_lines": trim_lines,
        "workers": workers,
        "seconds": time.monotonic() - started,
    }


def within(rss: int, explicit: int) -> bool:
    """The issue's bound: RSS within max(1.15 x, +16 MiB) of one explicit trim."""
    return rss <= max(1.15 * explicit, explicit + 16 * MiB)


def ray_once(
    hook: bool, *, tasks: int = 8, count: int = COUNT, settle_deadline: float | None = None
) -> dict[str, Any]:
    """Ray, 2 CPUs: ``tasks`` bursts, 10 s, then each of the 2 task workers' RSS against one
    explicit trim in it; whether the driver runs a trimmer. With ``settle_deadline`` (the
    tests'), each worker also waits, up to that many seconds, until its trimmer is quiet
    (:data:`QUIET_TICKS` ticks with no trim) and reports RSS then as ``rss_settled``."""
    import ray

    from memreclaim.runners import autostart

    # the tasks are this module's functions: the workers import it from here
    path = os.pathsep.join(
        p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
    )
    env: dict[str, Any] = {"env_vars": {"PYTHONPATH": path}}
    if hook:
        env["worker_process_setup_hook"] = "memreclaim.integrations.ray.setup"
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=env, log_to_driver=False)
    try:
        remote_burst = ray.remote(_ray_burst)
        started = time.monotonic()
        pids = ray.get([remote_burst.remote(i, count) for i in range(tasks)])
        wall = time.monotonic() - started
        time.sleep(SETTLE)
        read = ray.remote(_ray_read)
        # two tasks that overlap (each waits for the other) land in the two workers
        barrier = ray.remote(num_cpus=0)(_Barrier).remote()
        figures = ray.get([read.remote(barrier, settle_deadline) for _ in range(2)])
        driver = autostart.current() is not None
    finally:
        ray.shutdown()
    return {
        "route": "ray hook" if hook else "ray defaults",
        "finished": len(pids),
        "tasks": tasks,
        "wall": wall,
        "driver_trimmer": driver,
        "workers": figures,
    }


def _ray_burst(seed: int, count: int) -> int:
    burst(seed, count)
    return os.getpid()


class _Barrier:
    def __init__(self) -> None:
        self.arrived = 0

    def arrive(self) -> None:
        self.arrived += 1

    def count(self) -> int:
        return self.arrived


def _quiet_here(runner: Any, seconds: float) -> bool:
    """In a worker: wait until ``runner`` ticked :data:`QUIET_TICKS` times with no trim, at
    most ``seconds``; True when it did (a worker without a runner is quiet)."""
    if runner is None:
        return True
    end = time.monotonic() + seconds
    trims, ticks = runner.counters.trims, runner.counters.ticks
    while time.monotonic() < end:
        counters = runner.counters
        if counters.trims != trims:
            trims, ticks = counters.trims, counters.ticks
        elif counters.ticks - ticks >= QUIET_TICKS:
            return True
        time.sleep(0.25)
    return False


def _ray_read(barrier: Any, settle_deadline: float | None = None) -> dict[str, Any]:
    import ray

    import memreclaim
    from memreclaim.runners import autostart

    ray.get(barrier.arrive.remote())
    deadline = time.monotonic() + 30
    while ray.get(barrier.count.remote()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # until both readers hold a worker each
    runner = autostart.current()
    before = memreclaim.rss()
    quiet = None if settle_deadline is None else _quiet_here(runner, settle_deadline)
    settled = memreclaim.rss()
    memreclaim.trim()
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))
    return {
        "pid": os.getpid(),
        "peak": peak,
        "rss_later": before,
        "rss_settled": settled,
        "quiet": quiet,
        "explicit": memreclaim.rss(),
        "trimmer": runner is not None and runner.running,
        "trims": None if runner is None else runner.counters.trims,
    }


# ---- the report ------------------------------------------------------------------------------


def _mib(values: list[int]) -> str:
    low, high = min(values) / MiB, max(values) / MiB
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def _walls(runs: list[dict[str, Any]]) -> str:
    return " / ".join(f"{run['wall']:.0f}" for run in runs)


def table(runs: list[dict[str, Any]]) -> list[str]:
    """The Markdown rows of the Dask runs, one per route and limit."""
    lines = [
        "| limit | route | runs finished | peak (MiB) | RSS after the work | RSS 10 s later"
        " | unmanaged 10 s later | after one explicit trim | within max(1.15x, +16 MiB)"
        " | pauses | restarts | trims (log lines) | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for limit in LIMITS:
        for route in ROUTES:
            mine = [r for r in runs if r["route"] == route and r["limit"] == limit]
            if not mine:
                continue
            workers = [w for r in mine for w in r["workers"]]
            ok = sum(within(w["rss_later"], w["explicit"]) for w in workers)
            lines.append(
                f"| {limit} | {route} | {sum(r['done'] for r in mine)} of {len(mine)}"
                f" | {_mib([w['peak'] for w in workers])}"
                f" | {_mib([w['rss_after'] for w in workers])}"
                f" | {_mib([w['rss_later'] for w in workers])}"
                f" | {_mib([w['unmanaged_later'] for w in workers])}"
                f" | {_mib([w['explicit'] for w in workers])}"
                f" | {ok} of {len(workers)} workers"
                f" | {sum(r['pauses'] for r in mine)} | {sum(r['restarts'] for r in mine)}"
                f" | {sum(r['trim_log_lines'] for r in mine)}"
                f" | {_walls(mine)} |"
            )
    return lines


def ray_table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown rows of the Ray runs."""
    lines = [
        "| route | tasks finished | worker RSS 10 s later (MiB) | after one explicit trim |"
        " within max(1.15x, +16 MiB) | trimmer in the workers | trimmer in the driver |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        workers = row["workers"]
        lines.append(
            f"| {row['route']} | {row['finished']} of {row['tasks']}"
            f" | {_mib([w['rss_later'] for w in workers])}"
            f" | {_mib([w['explicit'] for w in workers])}"
            f" | {sum(within(w['rss_later'], w['explicit']) for w in workers)} of {len(workers)}"
            f" | {sum(w['trimmer'] for w in workers)} of {len(workers)}"
            f" | {'yes' if row['driver_trimmer'] else 'no'} |"
        )
    return lines


def verdicts(runs: list[dict[str, Any]], ray_rows: list[dict[str, Any]]) -> list[str]:
    """The issue's done-when lines, computed from the runs (never written by hand)."""
    lines = []
    for route in ("plugin", "preload", "environ"):
        tight = [r for r in runs if r["route"] == route and r["limit"] == "700MiB"]
        if tight:
            lines.append(
                f"- 700MiB, {route}: {sum(r['done'] for r in tight)} of {len(tight)} runs"
                f" finished, {sum(r['restarts'] for r in tight)} restart(s)"
                f" (done when: every run, at most 1 restart per 3 runs)."
            )
        roomy = [
            w for r in runs if r["route"] == route and r["limit"] == "1.5GiB" for w in r["workers"]
        ]
        if roomy:
            ok = sum(within(w["rss_later"], w["explicit"]) for w in roomy)
            lines.append(
                f"- 1.5GiB, {route}: {ok} of {len(roomy)} workers within max(1.15x, +16 MiB) of"
                " an explicit trim 10 s after the work (done when: all)."
            )
    for row in ray_rows:
        if row["route"] == "ray hook":
            ok = sum(within(w["rss_later"], w["explicit"]) for w in row["workers"])
            lines.append(
                f"- Ray, the hook: {ok} of {len(row['workers'])} task workers within the bound;"
                f" trimmer in the driver: {'yes' if row['driver_trimmer'] else 'no'}"
                " (done when: all, and no)."
            )
    return lines


def report(runs: list[dict[str, Any]], ray_rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/benchmarks/dask.md."""
    import distributed

    parts = [
        "# Dask and Ray workers: what each way of giving memory back leaves",
        "",
        "Written by `benchmarks/bench_dask.py` (its docstring has the workload and the routes):",
        f"`{meta['command']}` (load {meta['load_before']} before, {meta['load_after']} after"
        f" the last). distributed {distributed.__version__}, Python {sys.version.split()[0]},"
        " a shared 2-core machine, each part run alone under a quiet lock: read the wall times"
        " side by side.",
        "",
        f"`LocalCluster(n_workers=2, threads_per_worker=2, processes=True)`, {TASKS} tasks of"
        f" {COUNT:,} strings of 600-4,000 bytes each, every 50th kept as the task's result;"
        f" a run not done within {meta['deadline']:.0f} s counts as not finished. RSS figures"
        ' are per worker, the range over every worker of every run; "within" compares each'
        " worker's RSS 10 s after the work with one explicit `memreclaim.trim()` in it, made"
        " right after.",
        "",
        *table(runs),
        "",
        "Pauses count each time a worker was seen paused (its status, sampled every 0.25 s, or"
        " its log): two tasks at once hold about 80 % of 700 MiB *live* (2 x ~250 MiB of strings"
        " on the worker's ~65 MiB; the peak column), so every route may pause while they run;"
        " what differs is whether the worker comes back once they end. The issue's done-when"
        " lines, from these runs:",
        "",
        *verdicts(runs, ray_rows),
        "",
    ]
    if ray_rows:
        parts += [
            "## Ray",
            "",
            "`ray.init(num_cpus=2)`, 8 tasks of the same burst; 10 s later each of the two task"
            " workers reads its RSS, trims once and reads again.",
            "",
            *ray_table(ray_rows),
            "",
        ]
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per route and limit (3)")
    parser.add_argument("--limit", action="append", choices=LIMITS, help="only these limits")
    parser.add_argument("--route", action="append", choices=ROUTES, help="only these routes")
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds per run (120)")
    parser.add_argument("--ray", action="store_true", help="add the Ray rows")
    parser.add_argument("--write", type=Path, help="write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument(
        "--merge",
        type=Path,
        action="append",
        help="also report the runs of an earlier --json (a run split to fit a quiet window)",
    )
    args = parser.parse_args()
    commands = []
    earlier: list[dict[str, Any]] = []
    earlier_ray: list[dict[str, Any]] = []
    for path in args.merge or []:
        old = json.loads(path.read_text())
        earlier += old["runs"]
        earlier_ray += old["ray"]
        commands.append(f"{old['meta']['command']} (load {old['meta']['load_before']})")
    commands.append("python benchmarks/bench_dask.py " + " ".join(sys.argv[1:]))
    meta = {
        "command": "`, then `".join(commands),
        "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "deadline": args.deadline,
    }
    print(f"load: {meta['load_before']}", flush=True)
    runs = []
    for limit in args.limit or LIMITS:
        for route in args.route or ROUTES:
            for _ in range(args.runs):
                run = run_once(route, limit, deadline=args.deadline)
                runs.append(run)
                print(json.dumps(run), flush=True)
    ray_rows = [ray_once(False), ray_once(True)] if args.ray else []
    for row in ray_rows:
        print(json.dumps(row), flush=True)
    meta["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load: {meta['load_after']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ray": ray_rows, "meta": meta}, indent=1))
    text = report(earlier + runs, earlier_ray + ray_rows, meta)
    print(text)
    if args.write:
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
