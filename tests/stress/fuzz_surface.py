"""Fuzz the argument surface of every public call with hypothesis.

Any Python object, positional or keyword, into every public function: the call must return a
valid result or raise an ordinary exception (TypeError, ValueError, OverflowError,
UnsupportedAllocatorError, ...), never crash the interpreter and never raise SystemError (which
means the C code returned NULL without an exception, or an exception with a non-NULL result).

    python tests/stress/fuzz_surface.py --examples 300     # what tests/test_fuzz.py runs
    python tests/stress/fuzz_surface.py --examples 5000    # the stress variant
    MEMRECLAIM_FUZZ_SEED=7 python tests/stress/fuzz_surface.py   # other cases, reproducibly

A run is a fixed number of cases (``--examples`` per function) drawn from a fixed seed
(``--seed``, default $MEMRECLAIM_FUZZ_SEED or 0; printed first), so the same seed runs the same
cases. Prints a JSON summary and exits 0; a failure prints, per failing function, hypothesis's
minimal example and the exception, lists the failing functions in the summary, and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import faulthandler
import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import memreclaim
from memreclaim import _core


class Weird:
    """An object whose dunder methods misbehave: every conversion the C code might try raises."""

    def __index__(self) -> int:
        raise RuntimeError("__index__ raised")

    def __int__(self) -> int:
        raise RuntimeError("__int__ raised")

    def __bool__(self) -> bool:
        raise RuntimeError("__bool__ raised")

    def __len__(self) -> int:
        raise RuntimeError("__len__ raised")

    def __str__(self) -> str:
        raise RuntimeError("__str__ raised")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ raised")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ raised")

    def __hash__(self) -> int:
        raise RuntimeError("__hash__ raised")


class BigInt(int):
    """An int subclass (PyLong_Check passes) with a lying __index__."""

    def __index__(self) -> int:
        return -1


class Text(str):
    """A str subclass with a lying __len__."""

    def __len__(self) -> int:
        return -1


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(),
    st.text(),
    st.sampled_from(["1 MiB", "500 KB", "2g", " 1.5 GiB ", ".5k", "1e3", "-1", "", "1 XB"]),
    st.binary(),
    st.fractions(),
    st.decimals(),
    st.builds(Weird),
    st.builds(BigInt, st.integers()),
    st.builds(Text, st.text()),
    st.sampled_from([object(), type, int, Ellipsis, NotImplemented, memreclaim, print]),
    st.sampled_from([bytearray(b"12"), memoryview(b"34"), range(3), frozenset({1})]),
)
# Integers around every bound the knobs check (0, 1, 32 MiB, 2**31 - 1, 64 bits).
near_bounds = st.sampled_from([0, 1, 2**25, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64]).flatmap(
    lambda bound: st.integers(min_value=-bound - 2, max_value=bound + 2)
)
sizes = st.from_regex(r"\A\s?[0-9]{0,4}(\.[0-9]{0,3})?\s?([kKmMgGtT]i?[bB]?|[bB])?\s?\Z")
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=6,
)
# Keyword names: the real ones, near misses, and any text.
names = st.one_of(
    st.sampled_from(["pools", "heap", "nbytes", "n", "value", "self", "Pools", "heap "]),
    st.text(max_size=8),
)
free_form = st.tuples(st.lists(anything, max_size=3), st.dictionaries(names, anything, max_size=3))


def shaped(
    kind: str, keyword: str = ""
) -> st.SearchStrategy[tuple[list[object], dict[str, object]]]:
    """Half the examples have the call's own shape (so values reach the argument checks), half
    are free-form (wrong arity, unknown keywords)."""
    own: st.SearchStrategy[tuple[list[object], dict[str, object]]]
    if kind == "none":
        own = st.just(([], {}))
    elif kind == "one":
        value = st.integers(0, 4).flatmap(
            lambda pick: (near_bounds, st.integers(), sizes, anything, anything)[pick]
        )
        own = st.tuples(st.lists(value, min_size=1, max_size=1), st.just({}))
    else:  # a keyword flag
        value = st.integers(0, 1).flatmap(lambda pick: anything if pick else st.booleans())
        own = st.tuples(st.just([]), st.dictionaries(st.just(keyword), value, max_size=1))
    return st.integers(0, 3).flatmap(lambda pick: free_form if pick == 0 else own)


def trim_async(*args: Any, **kwargs: Any) -> memreclaim.TrimResult:
    return asyncio.run(memreclaim.trim_async(*args, **kwargs))


def _is(kind: type | tuple[type, ...]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, kind)


# name -> (function, argument strategy, check of a returned value)
TARGETS: dict[str, tuple[Callable[..., object], Any, Callable[[object], bool]]] = {
    "trim": (memreclaim.trim, shaped("kw", "pools"), _is(memreclaim.TrimResult)),
    "trim_async": (trim_async, shaped("kw", "pools"), _is(memreclaim.TrimResult)),
    "rss": (memreclaim.rss, shaped("none"), lambda value: isinstance(value, int) and value > 0),
    "stats": (memreclaim.stats, shaped("kw", "heap"), _is(memreclaim.MemoryStats)),
    "heap_stats": (memreclaim.heap_stats, shaped("none"), _is(memreclaim.HeapStats)),
    "allocator": (memreclaim.allocator, shaped("none"), _is(str)),
    "allocator_version": (memreclaim.allocator_version, shaped("none"), _is((str, type(None)))),
    "pin_mmap_threshold": (memreclaim.pin_mmap_threshold, shaped("one"), _is(type(None))),
    "set_trim_threshold": (memreclaim.set_trim_threshold, shaped("one"), _is(type(None))),
    "_core.set_arena_max": (_core.set_arena_max, shaped("one"), _is(type(None))),
    "set_arena_max": (memreclaim.glibc.set_arena_max, shaped("one"), _is(type(None))),
    "malloc_info": (memreclaim.glibc.malloc_info, shaped("none"), _is(str)),
    "arenas": (memreclaim.glibc.arenas, shaped("none"), _is(list)),
    "parse_bytes": (
        memreclaim.units.parse_bytes,
        shaped("one"),
        lambda value: isinstance(value, int) and value >= 0,
    ),
    "format_bytes": (memreclaim.units.format_bytes, shaped("one"), _is(str)),
}


# The pool-reclaim C module (CPython 3.11+): its calls too. main() enables pool reclaim first
# (it must happen before any thread starts: trim_async's executor would refuse it), so
# trim(pools=True) and estimate() reach their success paths.
try:
    from memreclaim import _pools
except ImportError:
    _pools = None  # type: ignore[assignment]
if _pools is not None:
    TARGETS.update(
        {
            "_pools.status": (_pools.status, shaped("none"), _is(dict)),
            "_pools.estimate": (_pools.estimate, shaped("none"), _is(int)),
            "_pools.enable": (_pools.enable, shaped("none"), _is(type(None))),
        }
    )
POOL_ERRORS: tuple[type[Exception], ...] = (
    (_pools.PoolReclaimUnavailable,) if _pools is not None else ()
)

# Ordinary exceptions a bad argument may raise. SystemError is never acceptable.
ALLOWED: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    OverflowError,
    memreclaim.UnsupportedAllocatorError,
    *POOL_ERRORS,  # trim(pools=True) or reclaim() before enable()
    ImportError,  # trim(pools=True) where memreclaim._pools is not built
    AttributeError,  # (PyCapsule_Import of a missing submodule)
)


def restore_knobs() -> None:
    """Undo whatever a fuzzed knob call set (a 1-byte mmap threshold would mmap every malloc)."""
    with contextlib.suppress(memreclaim.UnsupportedAllocatorError):
        memreclaim.pin_mmap_threshold(128 * 1024)
        memreclaim.set_trim_threshold(128 * 1024)
        _core.set_arena_max(8)


DEFAULT_SEED = int(os.environ.get("MEMRECLAIM_FUZZ_SEED", "0"))


def fuzz(name: str, examples: int, outcomes: Counter[str], seed_value: int = DEFAULT_SEED) -> None:
    function, strategy, valid = TARGETS[name]

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(call: tuple[list[object], dict[str, object]]) -> None:
        args, kwargs = call
        try:
            value = function(*args, **kwargs)
        except SystemError:
            raise
        except ALLOWED as exc:
            outcomes[f"{name}: {type(exc).__name__}"] += 1
            return
        except RuntimeError as exc:  # from Weird's dunders, reached through the Python layer
            if "raised" not in str(exc):
                raise
            outcomes[f"{name}: RuntimeError from the argument"] += 1
            return
        finally:
            restore_knobs()
        assert valid(value), f"{name}(*{args!r}, **{kwargs!r}) returned {value!r}"
        outcomes[f"{name}: ok"] += 1

    one()


def _crash_on_int(*args: object, **kwargs: object) -> None:
    """The --crash-canary target: a segfault whenever an int arrives (the harness must see it)."""
    if any(type(value) is int for value in (*args, *kwargs.values())):
        ctypes.string_at(0)


def _system_error_on_int(*args: object, **kwargs: object) -> None:
    """The --failing-canary target: SystemError whenever an int arrives (must be reported)."""
    if any(type(value) is int for value in (*args, *kwargs.values())):
        raise SystemError("canary: an int arrived")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per function")
    parser.add_argument("--only", default="", help="fuzz only functions whose name has this")
    parser.add_argument("--crash-canary", action="store_true", help="add a target that segfaults")
    parser.add_argument(
        "--failing-canary", action="store_true", help="add a target that raises SystemError"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="the cases' seed (default: $MEMRECLAIM_FUZZ_SEED or 0)",
    )
    args = parser.parse_args(argv)
    print(f"fuzz seed {args.seed}, {args.examples} examples per function", flush=True)
    faulthandler.enable()
    pools_enabled = None
    if _pools is not None:
        try:
            _pools.enable()
            pools_enabled = True
        except _pools.PoolReclaimUnavailable as exc:
            pools_enabled = False
            print(f"pool reclaim not enabled: {exc}", file=sys.stderr)
    if args.crash_canary:
        TARGETS["crash canary"] = (_crash_on_int, shaped("one"), _is(type(None)))
    if args.failing_canary:
        TARGETS["failing canary"] = (_system_error_on_int, shaped("one"), _is(type(None)))
    warnings.simplefilter("ignore")
    outcomes: Counter[str] = Counter()
    started = time.perf_counter()
    failures: dict[str, str] = {}
    for name in TARGETS:
        if args.only not in name:
            continue
        try:
            fuzz(name, args.examples, outcomes, args.seed)
        except Exception as exc:  # hypothesis re-raises the minimal failing example
            print(f"{name}:\n{traceback.format_exc()}", file=sys.stderr)
            failures[name] = f"{type(exc).__name__}: {exc}"[:500]
    summary = {
        "allocator": memreclaim.allocator(),
        "seed": args.seed,
        "examples_per_function": args.examples,
        "calls": sum(outcomes.values()),
        "seconds": round(time.perf_counter() - started, 2),
        "outcomes": dict(sorted(outcomes.items())),
        "pools_enabled": pools_enabled,
        "failures": len(failures),
        "failed": failures,
    }
    print(json.dumps(summary), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
