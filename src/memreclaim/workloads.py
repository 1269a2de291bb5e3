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
- :func:`small_objects`: a batch of objects of many pymalloc size classes (bytes, tuples,
  dicts, lists, floats, frozensets, strings), each rebuilt exactly from its key by
  :func:`small_object`, so that :func:`small_objects_intact` can check every one's content
  (the pool-reclaim tortures).

    >>> from memreclaim import workloads
    >>> data = workloads.strings(10_000)
    >>> survivors = workloads.keep_every(data, 50)
    >>> del data
    >>> survivors = workloads.spike(10_000, every=50)  # the same, in one call
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from . import _validate

__all__ = [
    "SMALL_KINDS",
    "buffers",
    "dicts",
    "keep_every",
    "small_object",
    "small_objects",
    "small_objects_intact",
    "spike",
    "strings",
]

MiB = 1 << 20
_T = TypeVar("_T")

SMALL_KINDS = 7
"""Kinds of :func:`small_object`: bytes, tuple, dict, list, float, frozenset, str."""
SmallKey = tuple[int, int, int]


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


def spike(count: int = 160_000, every: int = 50) -> list[tuple[str, float]]:
    """A burst over: :func:`strings` built, all but every ``every``-th freed (and garbage
    collected); returns the survivors, which keep the freed heap pages around them pinned."""
    every = _validate.integer("every", every)
    data = strings(count)
    survivors = keep_every(data, every)
    del data
    gc.collect()
    return survivors


def small_object(kind: int, i: int, n: int) -> object:
    """The object of ``kind`` (0 to ``SMALL_KINDS - 1``) built from ``i`` and ``n``: the same
    arguments always give an equal object. For ``n`` below 470 the object itself is at most
    512 bytes (pymalloc's); a dict's or a frozenset's table may be malloc's.
    """
    if kind == 0:
        return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]
    if kind == 1:
        return tuple(range(i, i + n % 60))
    if kind == 2:
        return {j: i for j in range(n % 6)}
    if kind == 3:
        return [i] * (n % 50)
    if kind == 4:
        return float(i) + n / 7
    if kind == 5:
        return frozenset(range(i % 7, i % 7 + n % 9))
    if kind == 6:
        return f"s{i}-" + "x" * (n % 400)
    raise ValueError(f"kind must be between 0 and {SMALL_KINDS - 1}, got {kind!r}")


def small_objects(count: int, rng: random.Random) -> list[tuple[SmallKey, object]]:
    """``count`` pairs of (key, ``small_object(*key)``) with keys drawn from ``rng``: kind,
    ``i`` below one million, ``n`` from 1 to 469. Draws the same keys for the same ``rng`` state.
    """
    count = _validate.integer("count", count)
    rng = _validate.instance("rng", rng, random.Random)
    items: list[tuple[SmallKey, object]] = []
    for _ in range(count):
        key = (rng.randrange(SMALL_KINDS), rng.randrange(10**6), rng.randrange(1, 470))
        items.append((key, small_object(*key)))
    return items


def small_objects_intact(items: Sequence[tuple[SmallKey, object]]) -> bool:
    """True when every object of ``items`` (from :func:`small_objects`) still equals the one its
    key builds: the content check after pages were given back and allocated into again."""
    return all(obj == small_object(*key) for key, obj in items)
