"""Seed 004: rounds of 12 buffers of 1-5 MiB with small strings allocated between them.

Each buffer is followed by 40 temporary strings and one that survives to the end. With
``--live-rounds N`` the last three buffers of each round stay alive for N rounds (a pipeline
whose outputs outlive the round). RSS is read after each round, once its temporaries are freed.

Modes: ``default``; ``pin`` (``pin_mmap_threshold(64 KiB)`` before the loop, glibc only);
``trim`` (``memreclaim.trim()`` after each round).
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from _common import emit

import memreclaim

MiB = 1 << 20

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
    rng = random.Random(4)
    survivors: list[str] = []
    outputs: list[list[bytes]] = []
    per_round: list[int] = []
    trim_seconds = 0.0
    start = time.perf_counter()
    for _ in range(args.rounds):
        buffers: list[bytes] = []
        temps: list[str] = []
        for _ in range(12):
            buffers.append(b"\x01" * rng.randint(1 * MiB, 5 * MiB))
            temps.extend("y" * rng.randint(600, 2000) for _ in range(40))
            survivors.append("z" * rng.randint(600, 2000))
        if args.live_rounds:
            outputs.append(buffers[-3:])
            if len(outputs) > args.live_rounds:
                outputs.pop(0)
        del buffers, temps
        gc.collect()
        if args.mode == "trim":
            trim_seconds += memreclaim.trim().seconds
        per_round.append(memreclaim.rss())
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
