"""Seed 000: 160,000 strings of 600-4,000 bytes from random.Random(0), keep every 50th, free.

Measures RSS at baseline, peak, after the free and after ``memreclaim.trim()`` (malloc_trim(0),
jemalloc purge, mi_collect or tcmalloc release: whichever allocator serves this process), plus
the physical floor (baseline + live bytes) and the page floor (baseline + pages holding a live
byte).
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from _common import emit, live_floors

import memreclaim

parser = argparse.ArgumentParser()
parser.add_argument("--count", type=int, default=160_000)
parser.add_argument("--keep-every", type=int, default=50)
args = parser.parse_args()

gc.collect()
base = memreclaim.rss()
start = time.perf_counter()
rng = random.Random(0)
data = [("x" * rng.randint(600, 4000), rng.random()) for _ in range(args.count)]
build = time.perf_counter() - start
peak = memreclaim.rss()
survivors = data[:: args.keep_every]
del data
gc.collect()
freed = memreclaim.rss()
live, pages = live_floors([survivors, *survivors, *(o for t in survivors for o in t)])
result = memreclaim.trim()
emit(
    baseline=base,
    peak=peak,
    after_free=freed,
    after_trim=memreclaim.rss(),
    physical_floor=base + live,
    page_floor=base + pages,
    trim_seconds=result.seconds,
    trim_method=result.method,
    build_seconds=build,
)
