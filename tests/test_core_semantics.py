"""What the core's figures mean, checked so that a wrong figure fails (tools/mutate.py's mutants).

Each scenario is engineered so that the right figure and the plausible wrong one differ by tens
of MiB: released is the anonymous drop even when shared pages appear during the trim; the mmap
threshold decides where a 200 KiB block goes; stats() fields each follow their own kind of
page. Memory workloads run in fresh interpreters (``run_python``); the reference figures are
read independently of memreclaim (/proc/self/statm, /proc/self/status, mallinfo2 via ctypes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import shared_library

import memreclaim

MiB = 1 << 20
KiB = 1 << 10

# A malloc_trim that first makes SHIM_TOUCH_MIB MiB resident: shared anonymous pages (shmem:
# resident, not anonymous RSS) with SHIM_SHARED set, private anonymous pages otherwise. memreclaim
# takes glibc's symbols from the object that defines its probe symbol (the test seam
# MEMRECLAIM_TEST_MALLOC_SYMBOL=malloc_trim names the shim), so the shim also forwards
# gnu_get_libc_version, and trim() calls the shim's malloc_trim.
SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int malloc_trim(size_t pad)
{
    int (*real)(size_t) = (int (*)(size_t))dlsym(RTLD_NEXT, "malloc_trim");
    const char *mib = getenv("SHIM_TOUCH_MIB");
    if (mib != NULL) {
        size_t n = strtoul(mib, NULL, 10) << 20;
        int flags = getenv("SHIM_SHARED") ? MAP_SHARED : MAP_PRIVATE;
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            memset(p, 1, n); /* kept mapped: the pages stay resident after the trim */
        }
    }
    return real(pad);
}

const char *gnu_get_libc_version(void)
{
    const char *(*real)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "gnu_get_libc_version");
    return real();
}
"""

MALLINFO2 = """
import ctypes
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
"""


@pytest.fixture(scope="module")
def trim_shim(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment that makes trim() call the shim."""
    lib = shared_library(SHIM_C, tmp_path_factory.mktemp("shim"), "trimshim")
    return {"LD_PRELOAD": str(lib), "MEMRECLAIM_TEST_MALLOC_SYMBOL": "malloc_trim"}


def test_released_is_the_anonymous_drop_not_the_resident_one(
    run_python: Callable[..., dict[str, Any]], trim_shim: dict[str, str]
) -> None:
    # During the trim 96 MiB of shared pages become resident: the resident drop is 96 MiB
    # smaller than the anonymous one, and released must be the anonymous one.
    out = run_python(
        """
        data, survivors = seed000_spike()
        del data; gc.collect()
        before = statm()
        result = memreclaim.trim()
        after = statm()
        emit(released=result.released, anon_before=result.anon_before,
             anon_after=result.anon_after, rss_before=result.rss_before,
             rss_after=result.rss_after, allocator=result.allocator,
             indep_anon=before[1] - after[1], indep_rss=before[0] - after[0])
        """,
        env={**trim_shim, "SHIM_TOUCH_MIB": "96", "SHIM_SHARED": "1"},
    )
    assert out["allocator"] == "glibc", out
    assert out["released"] > 200 * MiB, out
    assert out["released"] == out["anon_before"] - out["anon_after"], out
    resident_drop = out["rss_before"] - out["rss_after"]
    assert out["released"] - resident_drop > 80 * MiB, out  # the scenario really differs
    assert abs(out["released"] - out["indep_anon"]) < 4 * MiB, out


def test_released_is_zero_when_anonymous_memory_grows_during_the_trim(
    run_python: Callable[..., dict[str, Any]], trim_shim: dict[str, str]
) -> None:
    out = run_python(
        """
        result = memreclaim.trim()
        emit(released=result.released, anon_before=result.anon_before,
             anon_after=result.anon_after)
        """,
        env={**trim_shim, "SHIM_TOUCH_MIB": "64"},
    )
    assert out["anon_after"] - out["anon_before"] > 60 * MiB, out
    assert out["released"] == 0, out  # never negative


def test_trim_of_a_spike_reports_the_time_it_took(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    # Not a timing assertion: giving back hundreds of MiB is real work, so it takes some time.
    out = run_python(
        """
        data, survivors = seed000_spike()
        del data; gc.collect()
        result = memreclaim.trim()
        emit(released=result.released, seconds=result.seconds)
        """
    )
    assert out["released"] > 200 * MiB, out
    assert out["seconds"] > 0, out


def test_pin_mmap_threshold_decides_where_a_block_goes(
    run_python: Callable[..., dict[str, Any]],
) -> None:
    out = run_python(
        MALLINFO2
        + """
def place(threshold, size):
    memreclaim.pin_mmap_threshold(threshold)
    mapped0, heap0 = libc.mallinfo2().hblkhd, memreclaim.heap_stats()
    block = libc.malloc(size)
    mapped1, heap1 = libc.mallinfo2().hblkhd, memreclaim.heap_stats()
    libc.free(block)
    return dict(mmapped=mapped1 - mapped0, in_use=heap1.in_use - heap0.in_use,
                mapped=heap1.mapped - heap0.mapped, hblkhd=heap1.figures["hblkhd"],
                indep_hblkhd=mapped1)
# 1 MiB first: freeing an mmapped block raises glibc's adaptive threshold above that block,
# so a threshold that was never set would leave the second block in the heap. Two sizes: glibc
# 2.42+ keeps freed chunks of this size in its thread cache, which would hand the first block
# back to the second malloc without asking where a new one should go.
# The second block is larger than any free chunk or top a fresh interpreter's heap has: the
# threshold applies only to a block the heap cannot serve (300 KiB once fitted, 1 run in ~10).
large = place(1024 * 1024, 200 * 1024)
emit(small=place(64 * 1024, 4 * 1024 * 1024), large=large)
"""
    )
    small, large = out["small"], out["large"]
    assert small["mmapped"] >= 4 * MiB, out  # its own mapping under a 64 KiB threshold
    assert large["mmapped"] == 0, out  # in the heap under a 1 MiB one
    # heap_stats() counts the mmapped block as in use and as mapped, like mallinfo2 does
    assert small["in_use"] >= 4 * MiB - 10 * KiB, out
    assert small["mapped"] >= 4 * MiB, out
    assert small["hblkhd"] == small["indep_hblkhd"], out


def test_heap_stats_free_is_the_freed_heap(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        MALLINFO2
        + """
data, survivors = seed000_spike()
del data; gc.collect()
heap = memreclaim.heap_stats()
emit(free=heap.free, fordblks=libc.mallinfo2().fordblks)
"""
    )
    assert out["free"] > 200 * MiB, out
    assert abs(out["free"] - out["fordblks"]) < 4 * MiB, out


def test_stats_fields_follow_their_own_pages(run_python: Callable[..., dict[str, Any]]) -> None:
    # rss_anon follows a 200 MiB private spike, rss_shmem 96 MiB of shared anonymous pages;
    # peak_rss keeps the spike after it is gone; each agrees with /proc read independently.
    out = run_python(
        """
        import mmap
        def status():
            fields = {}
            with open("/proc/self/status") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        fields[key] = int(parts[0]) * 1024
            return fields
        def snap():
            st = memreclaim.stats()
            return dict(rss=st.rss, anon=st.rss_anon, file=st.rss_file, shmem=st.rss_shmem,
                        peak=st.peak_rss, swap=st.swap, rss_fn=memreclaim.rss(),
                        statm=statm(), status=status())
        base = snap()
        spike = bytearray(200 * 2**20)
        spike[::4096] = b"x" * len(spike[::4096])
        spiked = snap()
        del spike
        shared = mmap.mmap(-1, 96 * 2**20, flags=mmap.MAP_SHARED)
        for i in range(0, len(shared), 4096):
            shared[i] = 1
        done = snap()
        emit(base=base, spiked=spiked, done=done)
        """
    )
    base, spiked, done = out["base"], out["spiked"], out["done"]
    for snap in (base, spiked, done):
        resident, anon = snap["statm"]
        assert abs(snap["rss"] - resident) < 4 * MiB, out
        assert abs(snap["rss_fn"] - resident) < 4 * MiB, out
        assert abs(snap["anon"] - anon) < 4 * MiB, out
        assert abs(snap["file"] + snap["shmem"] - (resident - anon)) < 4 * MiB, out
        assert snap["peak"] == pytest.approx(snap["status"]["VmHWM"], abs=4 * MiB), out
        assert snap["swap"] == snap["status"].get("VmSwap", 0), out
    assert spiked["anon"] - base["anon"] > 190 * MiB, out
    assert done["shmem"] - spiked["shmem"] > 90 * MiB, out
    assert abs(done["file"] - spiked["file"]) < 8 * MiB, out
    assert done["rss_fn"] - done["statm"][1] > 90 * MiB, out  # rss() counts shared pages too
    assert spiked["anon"] - done["anon"] > 190 * MiB, out  # the spike is gone ...
    assert done["peak"] - done["rss"] > 90 * MiB, out  # ... but the peak remembers it


def test_trim_async_runs_in_the_executor_not_on_the_loop() -> None:
    threads: list[int] = []

    class Recording(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            def recorded() -> Any:
                threads.append(threading.get_ident())
                return fn(*args, **kwargs)

            return super().submit(recorded)

    async def main() -> tuple[int, memreclaim.TrimResult]:
        loop = asyncio.get_running_loop()
        executor = Recording(max_workers=1)
        loop.set_default_executor(executor)
        return threading.get_ident(), await memreclaim.trim_async()

    loop_thread, result = asyncio.run(main())
    assert isinstance(result, memreclaim.TrimResult)
    assert len(threads) == 1, threads
    assert threads[0] != loop_thread


def test_trim_accounting_adds_up(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        """
        from memreclaim import _accounting
        def delta(before, after):
            return dict(trims=after.trims - before.trims,
                        unproductive=after.unproductive - before.unproductive,
                        released=after.released_bytes - before.released_bytes,
                        seconds=after.seconds - before.seconds,
                        buckets=[a - b for a, b in zip(after.seconds_buckets,
                                                       before.seconds_buckets)])
        t0 = _accounting.totals()
        _accounting.record(5 * 2**20, 0.001)   # productive, exactly on the first bound
        _accounting.record(3 * 2**20, 0.002)
        _accounting.record(None, 99.0)          # unknown: unproductive, overflow bucket
        _accounting.record(2**19, 0.0)          # under 1 MiB: unproductive
        recorded = delta(t0, _accounting.totals())
        t1 = _accounting.totals()
        result = memreclaim.trim()
        trimmed = delta(t1, _accounting.totals())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, json.dumps(_accounting.totals().trims).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        emit(recorded=recorded, trimmed=trimmed, result_released=result.released,
             result_seconds=result.seconds, child_trims=json.loads(os.read(r, 100)))
        """
    )
    rec = out["recorded"]
    assert rec["trims"] == 4 and rec["unproductive"] == 2, out
    assert rec["released"] == 8 * MiB + 2**19, out
    assert rec["seconds"] == pytest.approx(99.003), out
    assert rec["buckets"][0] == 2 and rec["buckets"][1] == 1 and rec["buckets"][-1] == 1, out
    trimmed = out["trimmed"]
    assert trimmed["trims"] == 1, out
    assert trimmed["released"] == (out["result_released"] or 0), out
    assert trimmed["seconds"] == pytest.approx(out["result_seconds"]), out
    assert out["child_trims"] == 0, out  # a forked child starts its own account
