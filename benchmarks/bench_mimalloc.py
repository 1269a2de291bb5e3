"""Benchmark: what trim() leaves resident under a preloaded mimalloc, beside its own options.

The spike is memreclaim.workloads.spike() (160,000 strings of 600-4,000 bytes, every 50th kept),
made and freed on the main thread, by a worker thread that has exited (its task gone), or by a
live ThreadPoolExecutor worker; then the main thread gives memory back. Each cell is MiB resident
above the process's own start level after that, the median of --runs fresh interpreters.

Columns:
  own options      started with mimalloc's options for giving pages back at once
                   (2.0: MIMALLOC_RESET_DELAY=0 MIMALLOC_PAGE_RESET=1 MIMALLOC_RESET_DECOMMITS=1;
                   2.1+/3.x: MIMALLOC_PURGE_DELAY=0 MIMALLOC_PURGE_DECOMMITS=1), then trim()
  mi_collect       ctypes mi_collect(true) from the main thread (what trim() called before
                   issue 22)
  trim()           memreclaim.trim() at defaults
  ..., new thread  the same called from a new thread (one that never called malloc itself)
  +collect_thread  the live worker runs memreclaim._core.collect_thread(abandon=True) first
  knob at start    memreclaim.set_purge_delay(0) at start, then trim()
The ratio under each cell is to "own options"; the target is max(1.15 x, +16 MiB).

    python benchmarks/bench_mimalloc.py [--lib /usr/lib/x86_64-linux-gnu/libmimalloc.so.2]
                                        [--runs 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import textwrap

MiB = 2**20

# The child: params SCENARIO ("main", "exited", "live"), CALLER ("main", "thread": the thread
# that gives memory back), KNOB, ABANDON, RAW are prepended as assignments (child_code()).
# Shared with tests/test_mimalloc_reach.py. Prints one "RESULT {json}" line.
CHILD = textwrap.dedent(
    """
    import ctypes, gc, json, os, threading, time
    from concurrent.futures import ThreadPoolExecutor
    import memreclaim
    from memreclaim import workloads

    if RAW:  # set up here: a caller thread must not malloc (dlopen does) before it collects
        mi_collect = ctypes.CDLL(None).mi_collect
        mi_collect.argtypes = [ctypes.c_bool]

    def give_back():
        if RAW:
            mi_collect(True)
            return None
        return memreclaim.trim().released

    if KNOB:
        memreclaim.set_purge_delay(0)
    gc.collect(); give_back()
    base = memreclaim.rss()
    keep, peaks = [], []
    def spike():
        survivors = workloads.spike()
        peaks.append(memreclaim.rss())  # in the thread that made it, before it can exit
        return survivors
    if SCENARIO == "main":
        keep.append(spike())
    elif SCENARIO == "exited":
        tids = []
        def work():
            tids.append(threading.get_native_id())
            keep.append(spike())
        worker = threading.Thread(target=work)
        worker.start(); worker.join()
        # join() returns before the thread's TLS destructors (mimalloc's thread done) have
        # run: the thread has exited when its task has gone.
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/self/task/{tids[0]}"):
            assert time.monotonic() < deadline, "the worker's task is still there after 60 s"
            time.sleep(0.005)
    else:
        pool = ThreadPoolExecutor(1)
        keep.append(pool.submit(spike).result())
    gc.collect()
    methods = []
    if SCENARIO == "live" and ABANDON:
        collect = pool.submit(memreclaim._core.collect_thread, abandon=True).result()
        methods.append(collect.method)
    if CALLER == "main":
        released = give_back()
    else:  # a new thread, which has never called malloc itself
        box = []
        caller = threading.Thread(target=lambda: box.append(give_back()))
        caller.start(); caller.join()
        released = box[0]
    after = memreclaim.rss()
    print("RESULT " + json.dumps(dict(
        version=memreclaim.allocator_version(), allocator=memreclaim.allocator(), base=base,
        peak=peaks[0], after=after, released=released, methods=methods,
        survivors=sum(len(s) for s, _ in keep[0]))), flush=True)
    """
)


def own_options(major: int) -> dict[str, str]:
    """mimalloc's own options for giving freed pages back at once, by the version's names."""
    if major < 3:
        return {
            "MIMALLOC_RESET_DELAY": "0",
            "MIMALLOC_PAGE_RESET": "1",
            "MIMALLOC_RESET_DECOMMITS": "1",
        }
    return {"MIMALLOC_PURGE_DELAY": "0", "MIMALLOC_PURGE_DECOMMITS": "1"}


def major_version(lib: str) -> int:
    """The major version in a library's real file name (libmimalloc.so.2.0 -> 2)."""
    return int(os.path.realpath(lib).split(".so.", 1)[1].split(".")[0])


def child_code(scenario: str, caller: str = "main", **flags: bool) -> str:
    params = {"SCENARIO": scenario, "CALLER": caller, "KNOB": False, "ABANDON": False}
    params.update({"RAW": False, **{name.upper(): value for name, value in flags.items()}})
    return "".join(f"{name} = {value!r}\n" for name, value in params.items()) + CHILD


def run(
    lib: str, scenario: str, env: dict[str, str] | None = None, caller: str = "main", **flags: bool
) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    full_env.update({"LD_PRELOAD": lib, **(env or {})})
    proc = subprocess.run(
        [sys.executable, "-c", child_code(scenario, caller, **flags)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"{scenario} {flags} failed ({proc.returncode}):\n{proc.stderr}")


def find_lib() -> str:
    found = sorted(
        glob.glob("/usr/lib/*-linux-gnu/libmimalloc.so.[0-9]"),
        key=lambda p: int(p.rsplit(".", 1)[1]),
    )
    if not found:
        raise SystemExit("no libmimalloc.so.N found: apt-get install libmimalloc3 (or 2.0)")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lib", default=None, help="the libmimalloc to preload")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    lib = args.lib or find_lib()
    major = major_version(lib)
    columns = {
        "own options": {"env": own_options(major)},
        "mi_collect": {"raw": True},
        "trim()": {},
        "mi_collect, new thread": {"raw": True, "caller": "thread"},
        "trim(), new thread": {"caller": "thread"},
        "+collect_thread": {"abandon": True},
        "knob at start": {"knob": True},
    }
    rows = []
    version = "?"
    for scenario in ("main", "exited", "live"):
        cells: dict[str, float | None] = {}
        for name, flags in columns.items():
            if name == "+collect_thread" and scenario != "live":
                cells[name] = None
                continue
            flags = dict(flags)
            env = flags.pop("env", None)
            caller = flags.pop("caller", "main")
            left = []
            for _ in range(args.runs):
                out = run(lib, scenario, env=env, caller=caller, **flags)
                version = out["version"]
                left.append((out["after"] - out["base"]) / MiB)
            cells[name] = statistics.median(left)
        rows.append((scenario, cells))
    load = os.getloadavg()
    print(
        f"mimalloc {version} ({lib}), CPython {sys.version.split()[0]}, "
        f"median of {args.runs}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print("MiB resident above the start level after giving back (ratio to own options)\n")
    print("| spike freed by | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for scenario, cells in rows:
        reference = cells["own options"] or 1.0
        shown = []
        for name in columns:
            value = cells[name]
            if value is None:
                shown.append("-")
            elif name == "own options":
                shown.append(f"{value:.0f}")
            else:
                mark = "" if value <= max(1.15 * reference, reference + 16) else " (over)"
                shown.append(f"{value:.0f} ({value / reference:.2f}x){mark}")
        label = {"main": "main thread", "exited": "exited worker", "live": "live worker"}
        print(f"| {label[scenario]} | " + " | ".join(shown) + " |")


if __name__ == "__main__":
    main()
