"""docs/architecture.md rule 4, "one unproductive-trim floor": the C core's UNPRODUCTIVE_BELOW is
the only such constant; the process totals and the policy's default min_release both use it. And
the data path "A runner tick": one reading, taken by the C core."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from test_gil_sites import enclosing_functions

import memreclaim
from memreclaim import _accounting, _core
from memreclaim.policy import PacingPolicy

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "memreclaim"
MiB = 1 << 20


def test_the_policy_and_the_totals_share_the_c_floor() -> None:
    assert _core.UNPRODUCTIVE_BELOW == 1 << 20
    assert PacingPolicy(limit=None).min_release == _core.UNPRODUCTIVE_BELOW
    assert _accounting.UNPRODUCTIVE_BELOW is _core.UNPRODUCTIVE_BELOW


def test_no_python_module_defines_its_own_unproductive_floor() -> None:
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and "UNPRODUCTIVE" in target.id:
                    value = ast.unparse(node.value) if node.value is not None else ""
                    if value != "_core.UNPRODUCTIVE_BELOW":
                        defined.append(f"{path.relative_to(PACKAGE)}: {target.id} = {value}")
    assert defined == [], defined


# ---- the data path of a runner tick: one reading, taken by the C core --------------------------

TICK_READS = """
import sys
from memreclaim.runners import BackgroundTrimmer

trimmer = BackgroundTrimmer(
    slack="1MiB", min_interval=0.001, limit=None, thresholds=False, wake_on=()
)
trimmer.tick(settled=True)  # the floor
baseline = memreclaim.rss()
blocks = [bytearray(64 * 1024) for _ in range(SPIKE // (64 * 1024))]  # under mmap's threshold
keep = blocks[-1]  # pins the top: the freed blocks below stay in the heap until a trim
del blocks[:]
freed = memreclaim.rss()


def count(calls):
    def profile(frame, event, arg):
        if event == "c_call" and getattr(arg, "__module__", "") == "memreclaim._core":
            calls[arg.__name__] = calls.get(arg.__name__, 0) + 1
    return profile


ticks = []
for _ in range(2):  # the first trims, the second finds nothing over the slack
    calls = {}
    sys.setprofile(count(calls))
    event = trimmer.tick(settled=True)
    sys.setprofile(None)
    ticks.append({"trimmed": event is not None, "calls": calls})
thp_always = memreclaim._core.thp_settings().enabled == "always"
emit(ticks=ticks, held=freed - baseline, after=memreclaim.rss() - baseline, thp_always=thp_always)
"""


@pytest.mark.skipif(memreclaim.allocator() != "glibc", reason="the heap figures of glibc")
def test_a_runner_tick_reads_once_through_the_c_core(run_python: Any) -> None:
    """docs/architecture.md, "A runner tick": one statm read (``_core.sample``) for RSS and the
    address space (a second after a trim only under THP ``always``), the allocator's figures
    (``heap_stats``) only when the policy asks; a trim tick reads the heap at most twice (before
    the trim and after it: the policy needs the in-use bytes the trim started with, and the marks
    it leaves); no /proc/PID/status parse."""
    out = run_python(TICK_READS, params={"SPIKE": 256 * MiB})
    assert out["held"] > 200 * MiB, out
    assert out["after"] < 0.25 * out["held"], out  # the trim gave the spike back
    trimming, quiet = out["ticks"]
    assert trimming["trimmed"] and not quiet["trimmed"], out
    # The tick's reading; after the trim only where regrowth can happen (THP always): the trim
    # measures RSS itself.
    assert trimming["calls"].get("sample") == (2 if out["thp_always"] else 1), out
    assert trimming["calls"].get("trim") == 1, trimming
    assert 1 <= trimming["calls"].get("heap_stats", 0) <= 2, trimming
    assert quiet["calls"].get("sample") == 1 and quiet["calls"].get("heap_stats", 0) <= 1, quiet
    for tick in out["ticks"]:
        assert set(tick["calls"]) <= {"sample", "heap_stats", "trim", "thp_settings"}, tick


# ---- rule 2: struct sequences from C; a dict only for open-ended figures, and one exception ------

DICT = re.compile(r"\b(PyDict_New|PyDict_Copy)\s*\(|Py_BuildValue\(\s*\"\{")

# (file, enclosing function) -> the dict it makes, and why it is a dict.
DICTS = {
    ("heap.c", "core_trim"): "TrimResult.parts: one entry per part the trim reached (open-ended)",
    ("heap.c", "build_heap_stats"): "HeapStats.figures: the allocator's own named figures",
    ("heap.c", "core_stats"): "MemoryStats.libraries: one entry per registered library pool",
    ("_pools.c", "mrp_status"): "the exception: 0.2.0's PoolReclaimStatus TypedDict",
}


def _dict_sites(text: str) -> set[str]:
    """The enclosing function of each dict the C source ``text`` makes."""
    return set(enclosing_functions(DICT, text))


def test_the_detector_finds_the_functions_that_make_dicts() -> None:
    code = (
        "static PyObject *one(void)\n{\n    PyObject *d = PyDict_New();\n    return d;\n}\n"
        "static int two(void);\n"
        'static PyObject *three(PyObject *x)\n{\n    return Py_BuildValue("{s:i}", "a", 1);\n}\n'
    )
    assert _dict_sites(code) == {"one", "three"}


def test_c_makes_dicts_only_where_rule_2_says() -> None:
    found = {
        (path.name, function)
        for path in sorted(PACKAGE.glob("*.c"))
        for function in _dict_sites(path.read_text())
    }
    assert found == set(DICTS), (
        f"C functions that make dicts changed: new {sorted(found - set(DICTS))},"
        f" gone {sorted(set(DICTS) - found)} (rule 2: a struct sequence, or say why here)"
    )
    rule = (PACKAGE.parent.parent / "docs" / "architecture.md").read_text()
    assert "`_pools.status()` returns a dict" in rule and "tests/test_architecture_rules.py" in rule


def test_the_one_dict_result_is_the_released_typed_dict() -> None:
    from memreclaim import _pools, pools

    status = _pools.status()
    assert isinstance(status, dict)
    assert set(status) == set(pools.PoolReclaimStatus.__annotations__), sorted(status)


# ---- the C core's file readers: procfs.c (docs/architecture.md, "The C core") -----------------

OPENS = re.compile(r"\b(open|openat|fopen|fdopen|opendir|readlink|stat|lstat)\s*\(")


def test_only_procfs_c_opens_proc_or_sys_files() -> None:
    """Every /proc and sysfs file the C core reads is opened in procfs.c (the other files hand it
    a file name and a line callback: ``mr_self_lines``, ``mr_self_exe``)."""
    assert OPENS.search("fd = open(path, O_RDONLY);") and not OPENS.search("dlopen(name, 0)")
    openers = sorted(
        path.name
        for path in PACKAGE.glob("*.c")
        if OPENS.search(re.sub(r"/\*.*?\*/|\"(\\.|[^\"\\])*\"", "", path.read_text(), flags=re.S))
    )
    assert openers == ["procfs.c"], openers
