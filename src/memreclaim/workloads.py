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
- :func:`library_spike`: one burst of work through a real library's own data structures
  (numpy, pandas, pyarrow, Pillow, polars, or the stdlib's json), which lands where that
  library's allocator keeps it: glibc's heap and thread arenas, pyarrow's pool, polars'
  bundled jemalloc. The library is imported by the call, never by ``import memreclaim``.
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
    "LIBRARIES",
    "SMALL_KINDS",
    "buffers",
    "dicts",
    "keep_every",
    "library_spike",
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


LIBRARIES = ("numpy", "pandas", "pyarrow", "pillow", "polars", "json")
"""The libraries :func:`library_spike` knows, by the name it takes."""


def _numpy_spike(scale: float, keep: int) -> list[object]:
    import numpy as np

    rng = np.random.default_rng(7)
    kept: list[object] = []
    for i in range(int(160 * scale)):
        a = rng.random(int(rng.integers(60_000, 500_000)))  # 0.5-4 MB float64 buffers
        b = np.sort(a * 2.0 + 1.0)
        if i % keep == 0:
            kept.append(b[:2000].copy())
    return kept


def _pandas_spike(scale: float, keep: int) -> list[object]:
    import numpy as np
    import pandas as pd  # type: ignore[import-untyped]

    n = int(400_000 * scale)
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        {
            "key": [f"key{i % 5000}" for i in range(n)],
            "text": [f"value-{i}-" * 3 for i in range(n)],
            "x": rng.random(n),
        }
    )
    grouped = frame.groupby("key").agg({"x": "sum", "text": "first"})
    merged = frame.merge(grouped, left_on="key", right_index=True)
    # Survivors are plain records: a slice of an Arrow-backed column would keep its buffers.
    return [
        merged.iloc[i : i + 1].to_dict("records") for i in range(0, min(len(merged), 20_000), keep)
    ]


def _pyarrow_spike(scale: float, keep: int) -> list[object]:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    # A batch held at once (700 arrays of 400 KB in the pool), then string work on top.
    arrays = [pa.array(range(i, i + 50_000), type=pa.int64()) for i in range(int(700 * scale))]
    texts = [
        pc.utf8_upper(pa.array([f"row-{j}-{i}" * 4 for j in range(20_000)]))
        for i in range(int(20 * scale))
    ]
    return [*arrays[::keep], *texts[::keep]]


def _pillow_spike(scale: float, keep: int) -> list[object]:
    from PIL import Image

    rng = random.Random(7)
    kept: list[object] = []
    for i in range(int(120 * scale)):
        side = int(rng.uniform(700, 2000))  # 0.5-4 Mpx
        image = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
        turned = image.transpose(Image.Transpose.ROTATE_90)
        resized = turned.resize((side * 3 // 4, side * 3 // 4))
        if i % keep == 0:
            kept.append(resized.resize((64, 64)))
        del image, turned, resized
    return kept


def _polars_spike(scale: float, keep: int) -> list[object]:
    import polars as pl

    n = int(500_000 * scale)
    left = pl.DataFrame({"k": [i % 50_000 for i in range(n)], "s": [f"v{i}" * 3 for i in range(n)]})
    right = pl.DataFrame({"k": list(range(50_000)), "t": [f"w{i}" * 5 for i in range(50_000)]})
    joined = left.join(right, on="k").sort("s")
    return [joined.row(i) for i in range(0, min(len(joined), 20_000), keep)]


def _json_spike(scale: float, keep: int) -> list[object]:
    import json

    kept: list[object] = []
    for i in range(int(40 * scale)):
        records = [
            {"id": j, "name": f"user-{j}" * 8, "tags": ["a", "b", str(j)]} for j in range(8000)
        ]
        decoded = json.loads(json.dumps(records))
        if i % keep == 0:
            kept.append(decoded[:50])
    return kept


_LIBRARY_SPIKES: dict[str, Callable[[float, int], list[object]]] = {
    "numpy": _numpy_spike,
    "pandas": _pandas_spike,
    "pyarrow": _pyarrow_spike,
    "pillow": _pillow_spike,
    "polars": _polars_spike,
    "json": _json_spike,
}


def library_spike(library: str, *, scale: float = 1.0, every: int = 20) -> list[object]:
    """One burst of work through ``library`` (a name in :data:`LIBRARIES`); every ``every``-th
    result survives and is returned, everything else is freed (and garbage collected).

    At ``scale=1.0`` each burst peaks at a few hundred MiB: numpy sorts 160 arrays of 0.5-4 MB;
    pandas builds, groups and merges 400,000 rows (its strings live in pyarrow's pool from pandas
    3 on); pyarrow holds 700 arrays of 400 KB and upper-cases 20 arrays of 20,000 strings;
    Pillow turns and resizes 120 noise images of 0.5-4 Mpx; polars joins and sorts 500,000 rows;
    json dumps and loads 40 lists of 8,000 records. Raises ImportError when the library is not
    installed.
    """
    if library not in _LIBRARY_SPIKES:
        raise ValueError(f"library must be one of {', '.join(LIBRARIES)}, not {library!r}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale <= 16:
        raise ValueError(f"scale must be a number in (0, 16], not {scale!r}")
    every = _validate.integer("every", every, minimum=1)
    kept = _LIBRARY_SPIKES[library](float(scale), every)
    gc.collect()
    return kept


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
