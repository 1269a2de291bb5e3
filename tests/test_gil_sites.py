"""docs/architecture.md, "The GIL": every place the C code releases the GIL, by function, and
why. The test reads src/memreclaim/*.c and fails when a release site is added, moved to another
function or removed without this table (and the architecture page) saying so."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "memreclaim"
RELEASE = re.compile(r"\b(Py_BEGIN_ALLOW_THREADS|PyEval_SaveThread)\b")
FUNCTION = re.compile(r"^[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(")

# (file, enclosing function) -> why the GIL is released there.
SITES = {
    # the slow allocator calls
    ("heap.c", "trim_allocator"): "the allocator's purge call (malloc_trim, mallctl purge, ...)",
    ("heap.c", "build_heap_stats"): "mallinfo2()/mallctl statistics (walks under arena locks)",
    ("knobs.c", "core_malloc_info"): "glibc's malloc_info (walks every arena)",
    ("knobs.c", "core_set_purge_delay"): "mimalloc's option call",
    ("knobs.c", "core_collect_thread"): "the calling thread's collect (mi_collect / trim)",
    ("diag.c", "diag_glibc_tcache"): "the tcache probe's allocations",
    ("diag.c", "diag_mimalloc_collect"): "mi_collect",
    ("inspect.c", "core_mimalloc_areas"): "the mimalloc heap walk",
    # file readers other than the kept /proc/self/statm descriptor
    ("heap.c", "thp_after_trim"): "the THP mode read and the heaps' MADV_NOHUGEPAGE marking",
    ("heap.c", "thp_stats"): "smaps_rollup of this process",
    ("inspect.c", "core_process_status"): "/proc/PID/status",
    ("inspect.c", "core_process_rollup"): "/proc/PID/smaps_rollup",
    ("inspect.c", "core_process_heap_mapping"): "/proc/PID/maps",
    ("inspect.c", "thp_settings_result"): "the THP settings in sysfs",
    ("inspect.c", "core_thp_mark_heap"): "/proc/self/maps and madvise",
    ("diag.c", "diag_anon_mappings"): "/proc/self/smaps",
    # the pymalloc pool reclaim
    ("_pools_reclaim.c", "yield_gil"): "between GIL slices of trim(pools=True)",
    ("_pools_selftest.c", "mrp_run_selftest"): "waiting for the self-test's forked child",
}


def enclosing_functions(pattern: re.Pattern[str], text: str) -> list[str]:
    """The enclosing function of each line of a C source ``text`` that ``pattern`` matches, in
    order ("?" outside any function)."""
    found = []
    current = None
    for line in text.splitlines():
        match = FUNCTION.match(line)
        if match and not line.rstrip().endswith(";"):
            current = match.group(1)
        if pattern.search(line):
            found.append(current or "?")
    return found


def _sites(text: str) -> list[str]:
    """The enclosing function of each GIL release in a C source ``text``, in order."""
    return enclosing_functions(RELEASE, text)


def test_the_detector_finds_the_enclosing_function() -> None:
    code = (
        "static int slow(int x)\n{\n    Py_BEGIN_ALLOW_THREADS\n    x = f(x);\n"
        "    Py_END_ALLOW_THREADS\n    return x;\n}\n"
        "static void pause(void);\n"
        "static void yield_gil(void)\n{\n    PyThreadState *t = PyEval_SaveThread();\n}\n"
    )
    assert _sites(code) == ["slow", "yield_gil"]


def test_every_gil_release_is_listed() -> None:
    found = {}
    for path in sorted(PACKAGE.glob("*.c")):
        for function in _sites(path.read_text()):
            found[(path.name, function)] = found.get((path.name, function), 0) + 1
    assert set(found) == set(SITES), (
        f"GIL release sites changed: new {sorted(set(found) - set(SITES))},"
        f" gone {sorted(set(SITES) - set(found))} (update this table and docs/architecture.md)"
    )
    assert all(count == 1 for count in found.values()), found


def test_the_architecture_page_names_this_test_and_the_count() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "tests/test_gil_sites.py" in text
    assert f"{len(SITES)} places" in text
