"""memreclaim.glibc's thread-arena heuristics: arenas_retaining, fix_thread_trim_threshold and
nudge_arena, on real thread arenas in a fresh interpreter (each changes process state)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import allocator_lib

import memreclaim
from memreclaim import glibc

glibc_only = pytest.mark.skipif(memreclaim.allocator() != "glibc", reason="glibc's arenas")

THREAD_ARENAS = """
import threading
from memreclaim import glibc

held = []
ready = threading.Barrier(3)
done = threading.Event()

def fill():
    ready.wait(60)                                   # all alive at once: one arena each
    held.append([bytearray(100_000) for _ in range(60)])   # 6 MB in this thread's arena
    done.wait(60)

threads = [threading.Thread(target=fill) for _ in range(2)]
for t in threads:
    t.start()
ready.wait(60)
for _ in range(6000):                                # bounded: 60 s
    if len(held) == 2:
        break
    done.wait(0.01)
found = glibc.arenas_retaining(4 * 2**20)
above = glibc.arenas_retaining(100 * 2**20)
done.set()
for t in threads:
    t.join(60)
emit(found=found, above=above)
"""


@glibc_only
def test_arenas_retaining_sees_two_thread_arenas(run_python: Callable[..., Any]) -> None:
    result = run_python(THREAD_ARENAS)
    count, mapped = result["found"]
    assert count >= 2 and mapped > 4 * 2**20, result
    assert result["above"] is None, result  # not more than that slack


NUDGE = """
import threading
from memreclaim import glibc

def arena_of_thread():
    return max((a for a in glibc.arenas() if a.nr != 0), key=lambda a: a.mapped)

out = {}
go = threading.Event()

def worker():
    big = bytearray(4 * 2**20)                       # mmapped, then freed: glibc raises its
    del big                                          # trim threshold to 8 MiB (adaptive)
    blocks = [bytearray(100_000) for _ in range(50)] # 5 MB at this arena's top
    del blocks                                       # freed: the top is kept (< 8 MiB)
    out["kept"] = arena_of_thread().mapped
    go.wait(60)
    glibc.nudge_arena()                              # a 96 KiB free at the top, threshold fixed
    out["after"] = arena_of_thread().mapped

t = threading.Thread(target=worker)
t.start()
for _ in range(6000):
    if "kept" in out:
        break
    go.wait(0.01)
out["threshold"] = glibc.fix_thread_trim_threshold()
go.set()
t.join(60)
emit(**out)
"""


@glibc_only
def test_nudge_after_the_fix_gives_the_thread_arena_top_back(
    run_python: Callable[..., Any],
) -> None:
    result = run_python(NUDGE)
    assert result["threshold"] == glibc.THREAD_TRIM_THRESHOLD
    assert result["kept"] - result["after"] > 2 * 2**20, result


def test_arenas_retaining_rejects_a_bad_slack() -> None:
    with pytest.raises(ValueError, match="slack"):
        glibc.arenas_retaining(-1)
    with pytest.raises(TypeError, match="slack"):
        glibc.arenas_retaining(object())  # type: ignore[arg-type]


def test_fix_needs_glibc(run_python: Callable[..., Any]) -> None:
    lib = allocator_lib("jemalloc")
    result = run_python(
        """
        from memreclaim import glibc
        try:
            glibc.fix_thread_trim_threshold()
        except memreclaim.UnsupportedAllocatorError as exc:
            emit(error=str(exc), retaining=glibc.arenas_retaining(0))
        """,
        env={"LD_PRELOAD": str(lib)},
    )
    assert "glibc" in result["error"] and result["retaining"] is None, result
