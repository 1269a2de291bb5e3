"""Seed 003: a dict of 1,000,000 empty dicts; keep every Nth inner dict (0: keep none); free.

The inner dicts are pymalloc's (arenas of 1 MiB from mmap); the outer table is malloc's.
With ``--pools``, pool reclaim is enabled at start-up and the trim also gives back the pages of
empty pymalloc pools.
"""

from __future__ import annotations

import argparse
import gc
import time

from _common import trim_and_emit

import memreclaim
from memreclaim import workloads

parser = argparse.ArgumentParser()
parser.add_argument("--count", type=int, default=1_000_000)
parser.add_argument("--keep-every", type=int, default=0)
parser.add_argument(
    "--pools", action="store_true", help="enable_pool_reclaim() first, then trim(pools=True)"
)
args = parser.parse_args()
if args.pools:
    memreclaim.enable_pool_reclaim()  # at start-up: only arenas allocated later are covered

gc.collect()
base = memreclaim.rss()
start = time.perf_counter()
outer = workloads.dicts(args.count)
build = time.perf_counter() - start
peak = memreclaim.rss()
survivors = workloads.keep_every(list(outer.values()), args.keep_every)
outer.clear()
del outer
trim_and_emit(
    base=base, peak=peak, build=build, live_objects=[survivors, *survivors], pools=args.pools
)
