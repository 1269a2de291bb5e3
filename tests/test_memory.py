"""trim() and the knobs against real heaps, each in a fresh interpreter.

Spikes are hundreds of MiB so that noise can neither pass nor fail a test; every assertion is a
ratio against a baseline taken in the same process.
"""

from __future__ import annotations

from typing import Any

MiB = 2**20


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


def test_trim_releases_the_gil(run_python: Any) -> None:
    # A Python thread must make progress while trim() runs. The control, malloc_trim through
    # ctypes.PyDLL (which keeps the GIL), must show none: that proves the probe can fail. A long
    # switch interval keeps the interpreter from handing the GIL over between the reads of the
    # counter and the call: the spinner can only run when the call itself releases the GIL.
    out = run_python(
        """
        import ctypes, threading, time
        sys.setswitchinterval(1.0)
        counter = 0
        stop = False
        def spin():
            global counter
            while not stop:
                counter += 1
        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
        holding = ctypes.PyDLL(None).malloc_trim
        holding.argtypes = [ctypes.c_size_t]
        progress, control = [], []
        for attempt in range(3):
            data, survivors = seed000_spike()
            del data; gc.collect()
            time.sleep(0.001)  # come back with a fresh switch interval
            c0 = counter; holding(0); c1 = counter
            control.append(c1 - c0)
            data, survivors = seed000_spike()
            del data; gc.collect()
            time.sleep(0.001)
            c0 = counter; result = memreclaim.trim(); c1 = counter
            progress.append((c1 - c0, result.seconds, result.released))
        stop = True
        thread.join()
        emit(progress=progress, control=control)
        """
    )
    assert all(c == 0 for c in out["control"]), out
    assert all(released > 100 * MiB for _, _, released in out["progress"]), out
    assert max(steps for steps, _, _ in out["progress"]) > 0, out


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
        memreclaim.pin_mmap_threshold(memreclaim.MMAP_THRESHOLD_MAX)
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
