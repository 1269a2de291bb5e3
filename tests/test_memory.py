"""trim() and the knobs against real heaps, each in a fresh interpreter.

Spikes are hundreds of MiB so that noise can neither pass nor fail a test; every assertion is a
ratio against a baseline taken in the same process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import shared_library

MiB = 2**20
GATE_C = Path(__file__).resolve().parent / "c" / "trim_gate.c"


def test_seed000_spike_is_retained_then_trimmed(run_python: Any) -> None:
    out = run_python(
        """
        gc.collect(); memreclaim.trim()
        baseline = memreclaim.rss()
        data, survivors = seed000_spike()
        peak = memreclaim.rss()
        del data; gc.collect()
        after_free = memreclaim.rss()
        before_py = statm()
        result = memreclaim.trim()
        after_py = statm()
        emit(baseline=baseline, peak=peak, after_free=after_free, released=result.released,
             rss_after=result.rss_after, anon_before=result.anon_before,
             anon_after=result.anon_after, py_anon_before=before_py[1],
             py_anon_after=after_py[1], allocator=result.allocator)
        """
    )
    spike = out["peak"] - out["baseline"]
    assert spike > 300 * MiB, out
    # glibc keeps (almost) all of it after the objects are freed: retention, not a leak.
    assert out["after_free"] - out["baseline"] > 0.9 * spike, out
    # trim() gives at least 70% of the spike back ...
    assert out["released"] >= 0.7 * spike, out
    # ... and what it reports agrees with /proc/self/statm read independently.
    independent = out["py_anon_before"] - out["py_anon_after"]
    assert abs(out["released"] - independent) < 4 * MiB, out
    assert abs(out["anon_before"] - out["py_anon_before"]) < 4 * MiB, out


@pytest.fixture(scope="module")
def trim_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/c/trim_gate.c built: a malloc_trim that waits for another Python thread's answer."""
    return shared_library(GATE_C.read_text(), tmp_path_factory.mktemp("gate"), "trimgate")


def test_trim_releases_the_gil(run_python: Any, trim_gate: Path) -> None:
    # While trim() is in malloc_trim, another Python thread must be able to run. The preloaded
    # gate holds malloc_trim until a Python thread, woken by the gate, answers it: the thread can
    # only do that with the GIL. Nothing is timed: the gate's deadline only turns "never" into a
    # failure. The control, malloc_trim through ctypes.PyDLL (which keeps the GIL), must time
    # out in the gate: that proves the probe can fail.
    out = run_python(
        """
        import ctypes, threading
        gate = ctypes.CDLL(GATE)

        def outcomes():
            return {name: ctypes.c_int.in_dll(gate, "trim_gate_" + name).value
                    for name in ("passed", "timeouts")}

        def armed(timeout_ms):  # the gate for the next malloc_trim, and the thread answering it
            entered_r, entered_w = os.pipe()
            answer_r, answer_w = os.pipe()
            os.environ["MEMRECLAIM_TEST_TRIM_GATE"] = f"{entered_w},{answer_r},{timeout_ms}"
            def answer():
                os.read(entered_r, 1)  # waits without the GIL; returning from it needs the GIL
                os.write(answer_w, b"a")
            thread = threading.Thread(target=answer, daemon=True)
            thread.start()
            return thread

        holding = ctypes.PyDLL(None).malloc_trim
        holding.argtypes = [ctypes.c_size_t]
        thread = armed(CONTROL_MS)
        holding(0)
        control = outcomes()
        thread.join(60)
        data, survivors = seed000_spike()
        del data; gc.collect()
        thread = armed(GATE_MS)
        result = memreclaim.trim()
        after_trim = outcomes()
        thread.join(60)
        del os.environ["MEMRECLAIM_TEST_TRIM_GATE"]
        emit(control=control, after_trim=after_trim, released=result.released,
             allocator=result.allocator, answered=not thread.is_alive())
        """,
        env={"LD_PRELOAD": str(trim_gate), "MEMRECLAIM_TEST_MALLOC_SYMBOL": "malloc_trim"},
        params={"GATE": str(trim_gate), "CONTROL_MS": 1000, "GATE_MS": 60_000},
    )
    assert out["allocator"] == "glibc", out  # detection took the gate's malloc_trim for glibc's
    assert out["control"] == {"passed": 0, "timeouts": 1}, f"the probe cannot fail: {out}"
    assert out["after_trim"] == {"passed": 1, "timeouts": 1}, (
        f"no other thread ran during trim()'s malloc_trim within 60 s: the GIL was kept? {out}"
    )
    assert out["answered"], out
    assert out["released"] > 100 * MiB, out  # the gated call was the real trim


def test_pin_mmap_threshold_stops_the_seed004_climb(run_python: Any) -> None:
    workload = """
        import sys
        if PIN:
            memreclaim.pin_mmap_threshold(64 * 1024)
        baseline = memreclaim.rss()
        r = random.Random(1)
        keep = []
        for round_ in range(20):
            buffers = []
            for _ in range(30):
                buffers.append(bytearray(r.randint(1 << 20, 5 << 20)))
                # Survivors interleaved with the buffers. 16-32 KB: larger than the holes that
                # importing and compiling leave in the heap (they would swallow smaller ones and
                # pin nothing), smaller than the pinned threshold (so they stay on the heap).
                keep.append(bytes(r.randint(16_000, 32_000)))
            del buffers
            gc.collect()
        emit(growth=memreclaim.rss() - baseline)
        """
    default = run_python(workload, params={"PIN": False})
    pinned = run_python(workload, params={"PIN": True})
    assert default["growth"] > 50 * MiB, default
    # The survivors themselves are ~14 MiB in both runs.
    assert pinned["growth"] < 0.4 * default["growth"], (default, pinned)


def test_trim_threshold_governs_the_top_of_the_heap(run_python: Any) -> None:
    # With a huge trim threshold, free() keeps a large free top-of-heap; with a small one it
    # hands it back by itself.
    workload = """
        memreclaim.set_trim_threshold(THRESHOLD)
        memreclaim.pin_mmap_threshold(memreclaim.glibc.MMAP_THRESHOLD_MAX)
        baseline = memreclaim.rss()
        blocks = [bytearray(100_000) for _ in range(3000)]  # ~300 MB at the top of the heap
        del blocks
        emit(growth=memreclaim.rss() - baseline)
        """
    keep = run_python(workload, params={"THRESHOLD": 2**31 - 1})
    give = run_python(workload, params={"THRESHOLD": 128 * 1024})
    assert keep["growth"] > 200 * MiB, keep
    assert give["growth"] < 0.1 * keep["growth"], (keep, give)


def test_concurrent_trims_are_safe(run_python: Any) -> None:
    out = run_python(
        """
        import threading
        data, survivors = seed000_spike()
        del data; gc.collect()
        baseline_anon = statm()[1]
        results = []
        def worker():
            for _ in range(20):
                results.append(memreclaim.trim())
        threads = [threading.Thread(target=worker) for _ in range(8)]
        [t.start() for t in threads]; [t.join() for t in threads]
        emit(n=len(results), total=sum(r.released for r in results),
             negative=sum(r.released < 0 for r in results), gone=baseline_anon - statm()[1])
        """
    )
    assert out["n"] == 160 and out["negative"] == 0
    assert out["gone"] > 200 * MiB


def test_rss_after_fork_reports_the_child(run_python: Any) -> None:
    # The parent grows by 300 MiB after the fork; the child's kept descriptor must not follow it.
    out = run_python(
        """
        memreclaim.rss()          # open the kept descriptor in the parent
        r, w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.read(go_r, 1)      # wait until the parent has grown
            own = statm()[0]
            os.write(w, json.dumps([memreclaim.rss(), own]).encode())
            os._exit(0)
        os.close(w)
        big = bytearray(300 * 2**20)
        os.write(go_w, b"x")
        child_rss, child_own = json.loads(os.read(r, 1000))
        os.waitpid(pid, 0)
        emit(parent=memreclaim.rss(), child=child_rss, child_own=child_own)
        """
    )
    assert out["parent"] - out["child"] > 250 * MiB, out
    assert abs(out["child"] - out["child_own"]) < 8 * MiB, out
