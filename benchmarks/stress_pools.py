"""Stress job for pool reclaim (minutes; not part of the test suite).

Runs a torture workload in fresh interpreters, one per mode (pymalloc, pymalloc_debug, -X dev,
-X tracemalloc, and 3 allocating threads), each for --seconds:
  - many pymalloc size classes (bytes, str, tuples, lists, dicts, floats, sets);
  - random survivors, checked after every round and after allocating into released pools;
  - a reclaimer thread calling memreclaim.trim(pools=True) every --interval seconds (100 ms),
    whose passes release the GIL between slices while the other threads allocate and free.
Any mismatch, crash or non-zero exit fails the job (exit status 1).

    python benchmarks/stress_pools.py [--seconds 60] [--interval 0.1] [--modes pymalloc,debug,...]

It uses the memreclaim installed for the running interpreter.

Keep it bounded on shared machines: modes run one after another, one process at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import gc, json, random, sys, threading, time
    import memreclaim
    from memreclaim import pools, workloads

    seconds, threads, seed = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    interval = float(sys.argv[4])
    pools.enable_pool_reclaim()
    gc.disable()
    rng = random.Random(seed)

    def batch(r, count):
        return workloads.small_objects(count, r)

    verify = workloads.small_objects_intact

    failures = []
    stop = time.monotonic() + seconds

    def worker(wseed):
        r = random.Random(wseed)
        mine = []
        while time.monotonic() < stop and not failures:
            items = batch(r, 5_000)
            mine.extend(it for it in items if r.random() < 0.01)
            del items
            if not verify(mine):
                failures.append("worker survivors changed")
            if len(mine) > 5_000:
                del mine[: len(mine) // 2]

    reclaims = 0

    def reclaimer():
        global reclaims
        while time.monotonic() < stop and not failures:
            time.sleep(interval)
            try:
                memreclaim.trim(pools=True)
            except Exception as exc:
                failures.append(f"trim(pools=True) raised {exc!r}")
            reclaims += 1

    workers = [threading.Thread(target=worker, args=(seed * 100 + t,)) for t in range(threads)]
    workers.append(threading.Thread(target=reclaimer))
    for w in workers:
        w.start()

    survivors = []
    rounds = 0
    while time.monotonic() < stop and not failures:
        rounds += 1
        items = batch(rng, 50_000)
        # Per kind: none survive (whole pools empty out) or a few (pools stay pinned).
        rates = [rng.choice([0.0, 0.0, 0.001, 0.01, 0.05]) for _ in range(workloads.SMALL_KINDS)]
        survivors.extend(it for it in items if rng.random() < rates[it[0][0]])
        del items
        gc.collect()
        if not verify(survivors):
            failures.append("survivors changed")
        fresh = batch(rng, 30_000)
        if not (verify(fresh) and verify(survivors)):
            failures.append("objects changed after re-allocating into released pools")
        del fresh
        if len(survivors) > 30_000:
            rng.shuffle(survivors)
            del survivors[15_000:]
    for w in workers:
        w.join()
    st = pools.pool_reclaim_status()
    if st["arenas_skipped"]:
        failures.append(f"{st['arenas_skipped']} arenas failed validation")
    print("RESULT " + json.dumps(dict(failures=failures, rounds=rounds, reclaims=reclaims,
                                      pools_released=st["pools_released"],
                                      bytes_released=st["bytes_released"],
                                      used_pools_trimmed=st["used_pools_trimmed"],
                                      max_hold_ms=st["max_hold_ns"] / 1e6,
                                      max_hold_cpu_ms=st["max_hold_cpu_ns"] / 1e6)))
    """
)

MODES: dict[str, tuple[dict[str, str], list[str], int]] = {
    "pymalloc": ({}, [], 0),
    "debug": ({"PYTHONMALLOC": "pymalloc_debug"}, [], 0),
    "dev": ({}, ["-X", "dev"], 0),
    "tracemalloc": ({"PYTHONTRACEMALLOC": "1"}, [], 0),
    "threads": ({}, [], 3),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per mode")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between reclaims")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    args = parser.parse_args()

    failed = False
    started = time.monotonic()
    print(
        f"CPython {sys.version.split()[0]} ({sys.executable}), load average "
        f"{os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    for offset, mode in enumerate(args.modes.split(",")):
        env_extra, flags, threads = MODES[mode]
        env = dict(os.environ)
        env.pop("PYTHONMALLOC", None)
        env.update(env_extra)
        seed = args.seed + offset
        cmd = [
            sys.executable,
            *flags,
            "-c",
            CHILD,
            str(args.seconds),
            str(threads),
            str(seed),
            str(args.interval),
        ]
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=args.seconds + 300, check=False
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            failed = True
            print(f"{mode}: FAILED (exit {proc.returncode}, seed {seed})\n{proc.stderr[-3000:]}")
            continue
        result = json.loads(lines[-1][len("RESULT ") :])
        status = "FAILED" if result["failures"] else "ok"
        failed |= bool(result["failures"])
        print(
            f"{mode}: {status} {args.seconds:.0f} s, seed {seed}, {result['rounds']} rounds, "
            f"{result['reclaims']} reclaims, {result['pools_released']} empty pools released, "
            f"{result['used_pools_trimmed']} pools holding live blocks trimmed "
            f"({result['bytes_released'] / 2**20:.0f} MiB in all), longest GIL hold "
            f"{result['max_hold_ms']:.1f} ms wall, {result['max_hold_cpu_ms']:.1f} ms CPU, "
            f"CPython {sys.version.split()[0]} "
            f"{result['failures'][:3]}",
            flush=True,
        )
    print(
        f"{'FAILED' if failed else 'ok'}: {time.monotonic() - started:.0f} s wall for "
        f"{args.modes}, load average {os.getloadavg()[0]:.1f} at the end",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
