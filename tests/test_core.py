"""The C core's API: types, shapes, and every failure mode of its arguments."""

from __future__ import annotations

import errno
import importlib.machinery
import os
import sys
from typing import Any

import pytest
from conftest import allocator_lib

import memreclaim
from memreclaim import _core

GLIBC = memreclaim.allocator() == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="needs glibc's malloc")


def test_extension_really_built() -> None:
    # A compiled module built for this interpreter (no abi3: one build per interpreter, see
    # docs/architecture.md), not a pure-Python fallback.
    assert _core.__file__ is not None
    assert _core.__file__.endswith(importlib.machinery.EXTENSION_SUFFIXES[0])
    assert isinstance(_core.__loader__, importlib.machinery.ExtensionFileLoader)


def test_version_in_one_place() -> None:
    from memreclaim._version import __version__

    assert memreclaim.__version__ == __version__
    assert __version__.count(".") == 2


def test_allocator_is_detected() -> None:
    assert memreclaim.allocator() == "glibc"  # the test machine runs glibc's malloc
    assert memreclaim.allocator_version() == os.confstr("CS_GNU_LIBC_VERSION").split()[1]


def test_rss_matches_statm() -> None:
    page = os.sysconf("SC_PAGESIZE")
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * page
    value = memreclaim.rss()
    assert isinstance(value, int)
    assert abs(value - resident) < 8 * 2**20


def test_sample_is_one_statm_reading() -> None:
    page = os.sysconf("SC_PAGESIZE")
    with open("/proc/self/statm") as f:
        size, resident, shared = (int(x) * page for x in f.read().split()[:3])
    sample = _core.sample()
    assert isinstance(sample, _core.Sample) and len(sample) == 3
    assert abs(sample.rss - resident) < 8 * 2**20
    assert abs(sample.anon - (resident - shared)) < 8 * 2**20
    assert abs(sample.vsize - size) < 64 * 2**20
    assert sample.vsize >= sample.rss >= sample.anon > 0
    assert memreclaim.asdict(sample) == dict(zip(("rss", "anon", "vsize"), sample, strict=True))


def test_sample_takes_no_arguments() -> None:
    with pytest.raises(TypeError):
        _core.sample(True)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _core.sample(heap=True)  # type: ignore[call-arg]


def test_trim_result_fields() -> None:
    result = memreclaim.trim()
    assert isinstance(result, memreclaim.TrimResult)
    assert result.allocator == "glibc"
    assert result.method == "malloc_trim(0)"
    assert result.released is not None and result.released >= 0
    assert result.rss_before is not None and result.rss_before > 0
    assert result.rss_after is not None and result.rss_after > 0
    assert result.anon_before is not None and result.anon_after is not None
    assert result.released == max(0, result.anon_before - result.anon_after)
    assert result.seconds >= 0
    assert (result.pools_released, result.pools_bytes) == (0, 0)
    # Fields added later come last, so the old indexes stay.
    assert len(result) == 16 and tuple(result)[6] == "glibc" and tuple(result)[9] == 0
    assert result.via is None and result.reason is None
    # One part, the process allocator's, measured around the same call as `released`.
    assert result.parts == {"glibc": result.released}


def test_stats_fields() -> None:
    st = memreclaim.stats()
    assert isinstance(st, memreclaim.MemoryStats)
    assert st.rss > 0 and st.rss_anon is not None and st.rss_file is not None
    assert st.rss_anon + st.rss_file + (st.rss_shmem or 0) == st.rss
    assert st.peak_rss is not None and st.peak_rss >= st.rss
    assert st.heap is None
    assert st.allocator == "glibc"
    assert len(st) == 15 and tuple(st)[8] == "glibc"
    assert st.via is None and st.reason is None
    assert "pyarrow" not in sys.modules or "pyarrow" in st.libraries


def test_stats_traced_memory() -> None:
    import tracemalloc

    assert memreclaim.stats().traced_current is None or tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        keep = [bytes(1000) for _ in range(1000)]
        st = memreclaim.stats()
        assert st.traced_current is not None and st.traced_current >= 1_000_000
        assert st.traced_peak is not None and st.traced_peak >= st.traced_current
        del keep
    finally:
        tracemalloc.stop()
    assert memreclaim.stats().traced_current is None


@needs_glibc
def test_heap_stats_glibc() -> None:
    heap = memreclaim.heap_stats()
    figures = heap.figures
    assert set(figures) >= {"arena", "hblkhd", "uordblks", "fordblks", "keepcost"}
    assert heap.in_use == figures["uordblks"] + figures["hblkhd"]
    assert heap.free == figures["fordblks"]
    assert heap.mapped == figures["arena"] + figures["hblkhd"]
    with_heap = memreclaim.stats(heap=True).heap
    assert isinstance(with_heap, memreclaim.HeapStats)
    assert with_heap.allocator == "glibc"


@needs_glibc
def test_malloc_info_and_arenas() -> None:
    text = memreclaim.glibc.malloc_info()
    assert text.startswith("<malloc version=")
    arenas = memreclaim.glibc.arenas()
    assert arenas[0].nr == 0
    assert all(a.mapped >= 0 and a.free_bytes >= a.fast_bytes for a in arenas)


def test_struct_sequences_are_tuples() -> None:
    result = memreclaim.trim()
    assert tuple(result)[6] == "glibc"
    with pytest.raises(AttributeError):
        result.released = 1  # type: ignore[misc]


# ---- bad input -------------------------------------------------------------------------------

KNOBS = [
    (memreclaim.pin_mmap_threshold, 1, _core.MMAP_THRESHOLD_MAX),
    (memreclaim.set_trim_threshold, 0, 2**31 - 1),
    (_core.set_arena_max, 1, 2**31 - 1),
]


@pytest.mark.parametrize(("knob", "low", "high"), KNOBS)
@pytest.mark.parametrize("bad", ["1", 1.0, None, True, b"1", [1], object()])
def test_knob_wrong_type(knob: Any, low: int, high: int, bad: object) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        knob(bad)


@pytest.mark.parametrize(("knob", "low", "high"), KNOBS)
def test_knob_out_of_range(knob: Any, low: int, high: int) -> None:
    for value in (low - 1, high + 1, -(2**40)):
        with pytest.raises(ValueError, match=f"between {low} and {high}"):
            knob(value)
    for value in (2**63, 2**64 + 5, -(2**70)):
        with pytest.raises(OverflowError, match=f"between {low} and {high}"):
            knob(value)


@pytest.mark.parametrize(("knob", "low", "high"), KNOBS)
def test_knob_arity(knob: Any, low: int, high: int) -> None:
    with pytest.raises(TypeError):
        knob()
    with pytest.raises(TypeError):
        knob(low, low)


@pytest.mark.parametrize(
    "call",
    [
        lambda: memreclaim.trim(1),
        lambda: memreclaim.trim(pools=1),
        lambda: memreclaim.trim(pools="yes"),
        lambda: memreclaim.trim(heap=True),
        lambda: memreclaim.stats(1),
        lambda: memreclaim.stats(heap=None),
        lambda: memreclaim.stats(nope=True),
        lambda: memreclaim.rss(1),
        lambda: memreclaim.heap_stats(1),
        lambda: memreclaim.allocator(None),
        lambda: memreclaim.allocator_version(1),
        lambda: memreclaim.glibc.malloc_info(0),
    ],
)
def test_bad_arguments_raise_type_error(call: Any) -> None:
    with pytest.raises(TypeError):
        call()


def test_bad_knob_changes_nothing(run_python: Any) -> None:
    # A rejected value must leave the threshold as it was: pinned at 64 KiB, a block of 1 MiB or
    # more is still mmapped (hblks grows) after the failed calls. The threshold applies only to
    # a block the heap cannot serve, so the block is also larger than the heap's free space, top
    # included: under qemu-user (aarch64 wheels, tools/wheels.sh) a fresh interpreter's heap top
    # alone held 1.7 MiB, and a 1 MiB block came from it.
    out = run_python(
        """
        memreclaim.pin_mmap_threshold(64 * 1024)
        for bad in (0, -1, 2**26, 2**70, "1", 1.5):
            try:
                memreclaim.pin_mmap_threshold(bad)
            except (TypeError, ValueError, OverflowError):
                pass
        heap = memreclaim.heap_stats()
        size = max(1 << 20, heap.free + (64 << 10))
        block = bytearray(size)
        after = memreclaim.heap_stats().figures["hblks"]
        emit(before=heap.figures["hblks"], after=after, size=size)
        """
    )
    # below glibc's largest threshold: a threshold the bad calls had raised would not map it
    assert out["size"] < _core.MMAP_THRESHOLD_MAX, out
    assert out["after"] == out["before"] + 1, out


def test_set_arena_max_warns_when_late(run_python: Any) -> None:
    out = run_python(
        """
        import threading, warnings
        barrier = threading.Barrier(4)
        def work():
            barrier.wait()
            x = [bytes(2000) for _ in range(1000)]
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]; [t.join() for t in threads]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            memreclaim.glibc.set_arena_max(2)
        emit(arenas=len(memreclaim.glibc.arenas()), warnings=[str(w.message) for w in caught])
        """
    )
    assert out["arenas"] > 1
    assert len(out["warnings"]) == 1 and "is late" in out["warnings"][0]


def test_set_arena_max_at_start_limits_arenas(run_python: Any) -> None:
    out = run_python(
        """
        import threading, warnings
        warnings.simplefilter("error")
        memreclaim.glibc.set_arena_max(1)
        barrier = threading.Barrier(8)
        def work():
            barrier.wait()
            x = [bytes(2000) for _ in range(2000)]
        threads = [threading.Thread(target=work) for _ in range(8)]
        [t.start() for t in threads]; [t.join() for t in threads]
        emit(arenas=len(memreclaim.glibc.arenas()))
        """
    )
    assert out["arenas"] == 1


# ---- mimalloc's heap walk ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("64", 1), TypeError),
        ((True, 1), TypeError),
        ((1.5, 1), TypeError),
        ((1, None), TypeError),
        ((1,), TypeError),
        ((1, 2, 3), TypeError),
        ((1, 0), ValueError),
        ((-1, 1), OverflowError),
        ((1, 2**70), OverflowError),
    ],
)
def test_mimalloc_areas_bad_arguments(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        _core.mimalloc_areas(*args)


@needs_glibc
def test_mimalloc_areas_elsewhere_says_what_is_missing() -> None:
    with pytest.raises(memreclaim.UnsupportedAllocatorError, match=r"mi_heap_visit_blocks.*glibc"):
        _core.mimalloc_areas(64 * 1024, 1000)


@pytest.mark.timeout(300)
def test_mimalloc_areas_walks_this_threads_heap(run_python: Any) -> None:
    # Under mimalloc 2: 32 blocks of 1 MiB malloc'd on this thread are 32 MiB more of large
    # in-use bytes, and are gone from the walk once freed; small blocks count as small. The walk
    # is repeated (a fixed number of times) between allocations and frees: it must end each time.
    lib = str(allocator_lib("mimalloc"))
    out = run_python(
        """
        import ctypes
        from memreclaim import _core
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        walk = lambda: memreclaim.asdict(_core.mimalloc_areas(64 * 1024, 1_000_000))
        if memreclaim.allocator_version().split(".")[0] != "2":
            emit(skip=memreclaim.allocator_version())
            raise SystemExit
        before = walk()
        large = [libc.malloc(1 << 20) for _ in range(32)]
        small = [libc.malloc(100) for _ in range(20000)]
        during = walk()
        churn = []
        for i in range(2000):
            churn.append(bytearray(1000 + i % 5000))
            if i % 3 == 0:
                churn.pop(0)
            walk()
        for p in large + small:
            libc.free(p)
        after = walk()
        try:
            _core.mimalloc_areas(64 * 1024, 1)
            overflow = None
        except OSError as exc:
            overflow = exc.errno
        emit(before=before["large"], during=during["large"], after=after["large"],
             small_before=before["small"], small_during=during["small"],
             areas=during["areas"], addresses=len(during["addresses"]), overflow=overflow)
        """,
        env={"LD_PRELOAD": lib},
    )
    if "skip" in out:
        pytest.skip(f"mimalloc {out['skip']}: the walk no longer sees full pages (3.x)")
    MiB = 1 << 20
    assert out["during"] - out["before"] >= 32 * MiB, out
    assert out["after"] - out["before"] < 2 * MiB, out
    assert out["small_during"] - out["small_before"] >= 20000 * 100, out
    assert out["areas"] >= 32 and 0 < out["addresses"] <= min(out["areas"], 4096), out
    assert out["overflow"] == errno.EOVERFLOW, out


def test_units() -> None:
    assert memreclaim.units.parse_bytes("1 MiB") == 2**20
    assert memreclaim.units.parse_bytes("500 KB") == 500_000
    assert memreclaim.units.parse_bytes("1.5k") == 1500
    assert memreclaim.units.parse_bytes(42) == 42
    assert memreclaim.units.format_bytes(3 * 2**20) == "3.0 MiB"
    assert memreclaim.units.format_bytes(-512) == "-512 B"
    for junk in ("12 parsecs", "", "MiB", "-1", "1 2"):
        with pytest.raises(ValueError):
            memreclaim.units.parse_bytes(junk)
    with pytest.raises(ValueError):
        memreclaim.units.parse_bytes(-1)
    for wrong in (1.5, None, True, b"1"):
        with pytest.raises(TypeError):
            memreclaim.units.parse_bytes(wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        memreclaim.units.format_bytes("1")  # type: ignore[arg-type]


def test_keep_forever_outlives_the_last_reference_and_checks_its_arguments():
    # the wake-ups' way to let go of an epoll whose number the program reused: never finalized
    import weakref

    class Box:
        pass

    box = Box()
    ref = weakref.ref(box)
    assert _core._keep_forever(box) is None
    del box
    assert ref() is not None
    with pytest.raises(TypeError):
        _core._keep_forever()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _core._keep_forever(1, 2)  # type: ignore[call-arg]


def test_symbol_object_names_the_defining_object_and_checks_its_arguments():
    # the diagnosis names a native leak's library with it: extensions loaded RTLD_LOCAL too
    # (memreclaim's own; a stdlib module may be built into a distro's interpreter)
    found = _core._symbol_object("PyInit__core")
    assert found is not None and os.path.samefile(found, _core.__file__), found
    assert os.path.basename(_core._symbol_object("malloc_usable_size") or "").startswith("lib")
    assert _core._symbol_object("no_such_symbol_in_any_object_x") is None
    with pytest.raises(TypeError, match="name must be a str"):
        _core._symbol_object(1)  # type: ignore[arg-type]
    for bad in ("", "a\0b"):
        with pytest.raises(ValueError, match="non-empty symbol name"):
            _core._symbol_object(bad)
    with pytest.raises(TypeError):
        _core._symbol_object()  # type: ignore[call-arg]
