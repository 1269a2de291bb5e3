"""memreclaim.glibc's thread-arena heuristics: bound_thread_tops and nudge_arena, on real thread
arenas in a fresh interpreter (each changes process state); _environment_thresholds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import allocator_lib

import memreclaim
from memreclaim import glibc

glibc_only = pytest.mark.skipif(memreclaim.allocator() != "glibc", reason="glibc's arenas")

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
memreclaim.set_trim_threshold(128 * 1024)           # the threshold fixed: frees at a top trim
go.set()
t.join(60)
emit(**out)
"""


@glibc_only
def test_nudge_after_the_fix_gives_the_thread_arena_top_back(
    run_python: Callable[..., Any],
) -> None:
    result = run_python(NUDGE)
    assert result["kept"] - result["after"] > 2 * 2**20, result


# glibc's thresholds raised by a 30 MB buffer freed (the trim threshold to 60 MB, adaptive), then
# bound_thread_tops() or not, then 20 MB of 100 KB buffers made and freed by a thread that stays
# alive: what its arena maps more than before is the free top the bound limits.
BOUNDED_TOP = """
import threading
from memreclaim import glibc
big = bytearray(30_000_000)
del big
out = {}
if bounded:
    out["set"] = glibc.bound_thread_tops()
go = threading.Event()

def mapped():
    return {a.nr: a.mapped for a in glibc.arenas() if a.nr != 0}

def worker():
    before = mapped()
    blocks = [bytearray(100_000) for _ in range(200)]
    del blocks
    after = mapped()
    out["arenas"] = after
    out["top"] = max(size - before.get(nr, 0) for nr, size in after.items())
    go.wait(60)

t = threading.Thread(target=worker)
t.start()
for _ in range(6000):                                # bounded: 60 s
    if "top" in out:
        break
    go.wait(0.01)
go.set()
t.join(60)
emit(**out)
"""


@glibc_only
@pytest.mark.parametrize("bounded", [True, False])
def test_bound_thread_tops_bounds_a_live_thread_arena_top(
    run_python: Callable[..., Any], bounded: bool
) -> None:
    result = run_python(BOUNDED_TOP, params={"bounded": bounded})
    if bounded:
        assert result["set"] == [glibc.MMAP_THRESHOLD_MAX, glibc.THREAD_TOP_BOUND], result
        assert result["top"] <= glibc.THREAD_TOP_BOUND + 2 * 2**20, result
    else:  # the case the bound is for: the adaptive threshold lets the top keep all 20 MB
        assert result["top"] >= 16 * 2**20, result


def test_bound_thread_tops_needs_glibc(run_python: Callable[..., Any]) -> None:
    result = run_python(
        """
        from memreclaim import glibc
        try:
            glibc.bound_thread_tops()
        except memreclaim.UnsupportedAllocatorError as exc:
            emit(error=str(exc))
        """,
        env={"LD_PRELOAD": str(allocator_lib("jemalloc"))},
    )
    assert "glibc" in result["error"] and "jemalloc" in result["error"], result


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"MALLOC_TRIM_THRESHOLD_": "1000"}, "MALLOC_TRIM_THRESHOLD_=1000"),
        ({"MALLOC_TOP_PAD_": "0"}, "MALLOC_TOP_PAD_=0"),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, None),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=4096"},
            "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4096",
        ),
    ],
)
def test_environment_thresholds(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str | None
) -> None:
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert glibc._environment_thresholds() == expected


RUNNER_AT_START = """
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("memreclaim").addHandler(Keep())
logging.getLogger("memreclaim").setLevel(logging.INFO)
kwargs = {} if thresholds == "default" else {"thresholds": thresholds}
for _ in range(2):  # a second runner: said once per process
    with memreclaim.BackgroundTrimmer(**kwargs):
        pass
emit(said=[m for m in records if "glibc's" in m and "threshold" in m])
"""


@glibc_only
@pytest.mark.parametrize(
    ("thresholds", "env", "expected"),
    [
        (
            "default",
            {},
            "pinned glibc's mmap threshold at 32.0 MiB and its trim threshold at 4.0 MiB",
        ),
        (True, {}, "pinned glibc's mmap threshold at 32.0 MiB"),
        (False, {}, None),
        ("default", {"MALLOC_TRIM_THRESHOLD_": "65536"}, "MALLOC_TRIM_THRESHOLD_=65536"),
    ],
)
def test_runner_bounds_glibc_tops_at_start_unless_told(
    run_python: Callable[..., Any], thresholds: object, env: dict[str, str], expected: str | None
) -> None:
    result = run_python(RUNNER_AT_START, params={"thresholds": thresholds}, env=env)
    if expected is None:
        assert result["said"] == [], result
    else:
        assert len(result["said"]) == 1 and expected in result["said"][0], result


def test_runner_starts_when_glibc_lacks_mallopt(run_python: Callable[..., Any]) -> None:
    """A glibc without mallopt (a sanitizer interposing malloc, the detection seam here): the
    runners' start-up bound cannot be set; they start anyway, say why once, and change nothing."""
    result = run_python(
        """
        import logging
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
        logging.getLogger("memreclaim").addHandler(Keep())
        logging.getLogger("memreclaim").setLevel(logging.INFO)
        with memreclaim.BackgroundTrimmer(interval=5.0) as first:
            with memreclaim.BackgroundTrimmer(interval=5.0, name="second") as second:
                running = first.running and second.running
        emit(running=running, said=[r for r in records if "arena tops" in r])
        """,
        env={"MEMRECLAIM_TEST_HIDE_SYMBOLS": "mallopt"},
    )
    assert result["running"] is True, result
    assert len(result["said"]) == 1 and "mallopt" in result["said"][0], result
