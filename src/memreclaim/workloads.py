"""Reproducible memory workloads: the one source of the shapes used by the demo, the benchmarks
and the tests.

Each builder is deterministic (a fixed ``seed``) and returns the objects it built, so the caller
decides what survives, when to measure, and when to free. Sizes are chosen so that the memory
lands where the named allocator keeps it:

- :func:`strings`: a burst of requests. Strings of 600-4,000 bytes are above pymalloc's 512-byte
  limit, so they are malloc's; keeping every 50th pins most freed pages of a glibc heap.
- :func:`dicts`: a million small dicts, all pymalloc's (1 MiB arenas); one survivor per arena
  keeps the whole arena.
- :func:`buffers`: rounds of 1-5 MiB buffers with small strings between them; freeing a large
  mmapped block raises glibc's adaptive mmap threshold, so later buffers land in the heap.

    >>> from memreclaim import workloads
    >>> data = workloads.strings(10_000)
    >>> survivors = workloads.keep_every(data, 50)
    >>> del data
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from . import _validate

__all__ = ["buffers", "dicts", "keep_every", "strings"]

MiB = 1 << 20
_T = TypeVar("_T")


def strings(
    count: int = 160_000, *, seed: int = 0, smallest: int = 600, largest: int = 4000
) -> list[tuple[str, float]]:
    """``count`` pairs of (a string of ``smallest``-``largest`` bytes, a float), as a burst of
    requests leaves them: malloc's memory, not pymalloc's (above 512 bytes)."""
    count = _validate.integer("count", count)
    smallest = _validate.integer("smallest", smallest, minimum=1)
    largest = _validate.integer("largest", largest, minimum=smallest)
    rng = random.Random(seed)
    return [("x" * rng.randint(smallest, largest), rng.random()) for _ in range(count)]


def dicts(count: int = 1_000_000) -> dict[int, dict[str, int]]:
    """A dict of ``count`` empty dicts: the inner dicts are pymalloc's, the outer table malloc's."""
    count = _validate.integer("count", count)
    return {i: {} for i in range(count)}


def buffers(
    rounds: int = 20,
    *,
    seed: int = 4,
    per_round: int = 12,
    live_rounds: int = 0,
    after_round: Callable[[int], object] | None = None,
) -> list[str]:
    """Rounds of ``per_round`` buffers of 1-5 MiB, each followed by 40 temporary strings of
    600-2,000 bytes and one that survives. With ``live_rounds`` the last three buffers of each
    round stay alive for that many rounds (a pipeline whose outputs outlive the round).

    ``after_round(i)`` is called after round ``i``'s temporaries are freed (to trim or measure).
    Returns the surviving small strings; every buffer is freed when it returns.
    """
    rounds = _validate.integer("rounds", rounds)
    per_round = _validate.integer("per_round", per_round, minimum=1)
    live_rounds = _validate.integer("live_rounds", live_rounds)
    after_round = _validate.callback("after_round", after_round, takes="the round number")
    rng = random.Random(seed)
    survivors: list[str] = []
    outputs: list[list[bytes]] = []
    for index in range(rounds):
        made: list[bytes] = []
        temps: list[str] = []
        for _ in range(per_round):
            made.append(b"\x01" * rng.randint(1 * MiB, 5 * MiB))
            temps.extend("y" * rng.randint(600, 2000) for _ in range(40))
            survivors.append("z" * rng.randint(600, 2000))
        if live_rounds:
            outputs.append(made[-3:])
            if len(outputs) > live_rounds:
                outputs.pop(0)
        del made, temps
        if after_round is not None:
            after_round(index)
    outputs.clear()
    return survivors


def keep_every(data: Sequence[_T], every: int) -> list[_T]:
    """Every ``every``-th item of ``data`` (0 keeps none): the survivors of a burst."""
    every = _validate.integer("every", every)
    return [] if every == 0 else list(data[::every])
