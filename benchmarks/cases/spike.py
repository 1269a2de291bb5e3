"""Seed 000: 160,000 strings of 600-4,000 bytes (memreclaim.workloads.strings), keep every 50th,
free.

Measures RSS at baseline, peak, after the free and after ``memreclaim.trim()`` (malloc_trim(0),
jemalloc purge, mi_collect or tcmalloc release: whichever allocator serves this process), plus
the physical floor (baseline + live bytes) and the page floor (baseline + pages holding a live
byte).
"""

from __future__ import annotations

import argparse
import gc
import threading
import time

from _common import trim_and_emit

import memreclaim
from memreclaim import workloads

parser = argparse.ArgumentParser()
parser.add_argument("--count", type=int, default=160_000)
parser.add_argument("--keep-every", type=int, default=50)
parser.add_argument("--threads", type=int, default=1, help="build the spike in N threads")
args = parser.parse_args()


def build_part(seed: int, count: int, out: list[tuple[str, float]]) -> None:
    out.extend(workloads.strings(count, seed=seed))


gc.collect()
base = memreclaim.rss()
start = time.perf_counter()
data: list[tuple[str, float]] = []
if args.threads == 1:
    build_part(0, args.count, data)
else:  # each thread builds its share (glibc gives each its own arena), then they are joined
    parts: list[list[tuple[str, float]]] = [[] for _ in range(args.threads)]
    workers = [
        threading.Thread(target=build_part, args=(i, args.count // args.threads, parts[i]))
        for i in range(args.threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for part in parts:
        data.extend(part)
    del parts
build = time.perf_counter() - start
peak = memreclaim.rss()
survivors = workloads.keep_every(data, args.keep_every)
del data
trim_and_emit(
    base=base,
    peak=peak,
    build=build,
    live_objects=[survivors, *survivors, *(o for t in survivors for o in t)],
)
