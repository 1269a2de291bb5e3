"""Seed 004: rounds of 12 buffers of 1-5 MiB with small strings allocated between them
(memreclaim.workloads.buffers).

Each buffer is followed by 40 temporary strings and one that survives to the end. With
``--live-rounds N`` the last three buffers of each round stay alive for N rounds (a pipeline
whose outputs outlive the round). RSS is read after each round, once its temporaries are freed.

Modes: ``default``; ``pin`` (``pin_mmap_threshold(64 KiB)`` before the loop, glibc only);
``trim`` (``memreclaim.trim()`` after each round).
"""

from __future__ import annotations

import argparse
import gc
import time

from _common import emit

import memreclaim
from memreclaim import workloads

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("default", "pin", "trim"), default="default")
parser.add_argument("--rounds", type=int, default=20)
parser.add_argument("--live-rounds", type=int, default=0)
args = parser.parse_args()


def main() -> None:
    if args.mode == "pin":
        memreclaim.pin_mmap_threshold(64 * 1024)
    gc.collect()
    base = memreclaim.rss()
    per_round: list[int] = []
    trim_seconds = 0.0

    def after_round(_: int) -> None:
        nonlocal trim_seconds
        gc.collect()
        if args.mode == "trim":
            trim_seconds += memreclaim.trim().seconds
        per_round.append(memreclaim.rss())

    start = time.perf_counter()
    workloads.buffers(args.rounds, live_rounds=args.live_rounds, after_round=after_round)
    wall = time.perf_counter() - start
    emit(
        baseline=base,
        per_round=per_round,
        final=per_round[-1],
        max_round=max(per_round),
        wall_seconds=wall,
        trim_seconds=trim_seconds,
    )


main()
