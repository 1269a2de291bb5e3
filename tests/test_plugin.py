"""Tests of the pytest plugin (memreclaim.pytest_plugin) with pytester.

Workloads whose classification depends on process memory run through
``pytester.runpytest_subprocess``, so each runs in a fresh interpreter; usage errors and
help text run in-process. Assertions are on the classification text the plugin prints.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest

pytestmark = pytest.mark.slow  # CI's `slow` step (.ci/run)
pytest_plugins = ["pytester"]

PRELUDE = """
import ctypes, gc, random
import pytest
from memreclaim import workloads

LEAK = []
KEEP = []
CACHE = {}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]


def leaky():
    LEAK.extend({"n": i} for i in range(20_000))  # LEAKING LINE


def spike_000():
    survivors = workloads.spike()
    del survivors
"""

# pytester strips the leading blank line, so line numbers count from PRELUDE's first text line.
LEAK_LINE = (
    PRELUDE.strip("\n")
    .splitlines()
    .index('    LEAK.extend({"n": i} for i in range(20_000))  # LEAKING LINE')
    + 1
)


def make(pytester: pytest.Pytester, body: str, name: str = "test_work") -> None:
    pytester.makepyfile(**{name: PRELUDE + textwrap.dedent(body)})


ASYNCIO_INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


@pytest.fixture(autouse=True)
def _asyncio_ini(request: pytest.FixtureRequest) -> None:
    """Give each inner pytest run the ini line pytest-asyncio asks for, so it does not warn."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester").makeini(ASYNCIO_INI)


@pytest.mark.timeout(600)
def test_python_leak_fails_with_the_leaking_line(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.no_leak(limit="1 MiB", repeat=3)
        def test_marked():
            leaky()

        def test_fixture_measure(memory):
            memory.measure(leaky, repeat=3, warmup=1)
        """,
        name="test_pyleak",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*memreclaim (@no_leak): leaked * per run (Python), over the 1.0 MiB limit*",
            "*verdict: Python leak * per iteration*",
            "*memreclaim: @no_leak*",
            f"*test_pyleak.py:{LEAK_LINE}: +* in +* blocks*",
        ]
    )
    # The fixture's failure is the report, located at the test's call, not plugin internals.
    result.stdout.fnmatch_lines(
        [
            "*_ test_fixture_measure _*",
            "test_pyleak.py:*: memreclaim (memory.measure()): leaked * per run (Python), over the"
            " 1.0 MiB limit",
            "memreclaim diagnosis (*, 3 iterations after 1 warm-up)",
            "verdict: Python leak *",
        ]
    )
    assert "raise error" not in out and "def measure(" not in out  # no plugin source
    assert "native leak" not in out.split("verdict:")[1].splitlines()[0]
    assert "next: Python objects stay referenced" in out


@pytest.mark.timeout(600)
def test_native_leak_fails_though_tracemalloc_saw_nothing(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.no_leak(limit="512 KiB", repeat=3)
        def test_native():
            p = libc.malloc(1 << 20)
            ctypes.memset(p, 1, 1 << 20)
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*memreclaim (@no_leak): leaked * per run (native, malloc), over the 512.0 KiB limit*",
            "*verdict: native leak (malloc) 3.0 MiB (* per iteration, tracemalloc saw *",
            "*next: C code allocated without freeing*",
        ]
    )


@pytest.mark.timeout(600)
def test_fixture_measures_without_tracemalloc(pytester: pytest.Pytester) -> None:
    # memory.measure(trace=False): the cheap mode still fails on a native leak, and says the
    # Python component was not measured.
    make(
        pytester,
        """
        import tracemalloc
        def test_native(memory):
            def work():
                assert not tracemalloc.is_tracing()
                p = libc.malloc(1 << 20)
                ctypes.memset(p, 1, 1 << 20)
            memory.measure(work, repeat=3, leak="512 KiB", trace=False)
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*leaked * per run (native, malloc), over the 512.0 KiB limit*",
            "*note: tracemalloc was off*",
        ]
    )


@pytest.mark.timeout(600)
def test_allocator_retention_passes_and_is_reported(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.no_leak(limit="1 MiB")
        @pytest.mark.reclaims(limit="16 MiB")
        def test_spike():
            spike_000()
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*memreclaim: @no_leak + @reclaims*",
            "*verdict: allocator retention *MiB (freed, held by the allocator; not a leak)*",
            "*memreclaim: retention notes*",
            "*test_work.py::test_spike: allocator retention * MiB (freed, held by the allocator*",
        ]
    )


@pytest.mark.timeout(600)
def test_pymalloc_survivors_pass_as_unreclaimed_retention(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        def test_dicts(memory):
            with memory.check(leak="1 MiB") as result:
                data = [{"k": i} for i in range(1_000_000)]
                KEEP.extend(data[::1000])   # survivors outlive the block
                del data
            report = result.report
            print("KIND", report.kind, report.python_leak < 1024 * 1024)

        @pytest.mark.reclaims(limit="8 MiB")
        def test_reclaims_fails_on_pinned_arenas():
            data = [{"k": i} for i in range(300_000)]
            KEEP.extend(data[::1000])
            del data
        """,
    )
    # One process per workload: the second would reuse the first one's pinned arenas.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-s", "-k", "dicts")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*KIND pymalloc_retention True*",
            "*retention notes*",
            "*test_work.py::test_dicts: pymalloc retention * MiB (pymalloc arenas kept by a few"
            " live small objects; not a leak)*",
        ]
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "reclaims")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*memreclaim (@reclaims): * MiB stayed resident after trim, over the 8.0 MiB limit*",
            "*verdict: pymalloc retention * MiB (pymalloc arenas kept by a few live small"
            " objects; not a leak)*",
        ]
    )


@pytest.mark.timeout(600)
def test_one_time_cache_passes_with_repeat_and_warmup(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        def fill(cache):
            if not cache:
                cache.update((i, str(i) * 20) for i in range(100_000))

        @pytest.mark.no_leak(limit="1 MiB", repeat=3, warmup=1)
        def test_warm():
            fill(CACHE)

        OTHER = {}

        @pytest.mark.no_leak(limit="1 MiB", repeat=5)
        def test_median_ignores_first_fill():
            fill(OTHER)

        THIRD = {}

        @pytest.mark.no_leak(limit="1 MiB")
        def test_single_shot_sees_growth():
            fill(THIRD)
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*_ test_single_shot_sees_growth _*", "*verdict: Python leak*"])
    result.stdout.fnmatch_lines(["*one-time growth * MiB  (not repeated per iteration*"])


@pytest.mark.timeout(600)
def test_async_tests_are_measured(pytester: pytest.Pytester) -> None:
    if importlib.util.find_spec("pytest_asyncio") is None:
        pytest.skip("pytest-asyncio not installed")
    make(
        pytester,
        """
        import asyncio
        CALLS = []

        @pytest.mark.asyncio
        @pytest.mark.no_leak(limit="1 MiB", repeat=3, warmup=1, trace=True)  # 4 calls, no re-run
        async def test_async_leak():
            CALLS.append(1)
            await asyncio.sleep(0)
            leaky()

        @pytest.mark.asyncio
        @pytest.mark.no_leak(limit="1 MiB", repeat=2, warmup=1)
        async def test_async_clean():
            await asyncio.sleep(0)

        def test_calls_counted():
            assert len(CALLS) == 4

        @pytest.mark.asyncio
        async def test_fixture_ameasure(memory):
            async def work():
                await asyncio.sleep(0)
                leaky()
            await memory.ameasure(work, repeat=2, warmup=0)
        """,
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function"
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*memreclaim (@no_leak): leaked * per run*",
            "*verdict: Python leak*",
            "*test_work.py:*: memreclaim (memory.ameasure()): leaked * per run (Python)*",
        ]
    )


@pytest.mark.timeout(600)
def test_xdist_two_workers(pytester: pytest.Pytester) -> None:
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist not installed")
    make(
        pytester,
        """
        @pytest.mark.no_leak(limit="1 MiB", repeat=2)
        def test_leaks():
            leaky()

        @pytest.mark.no_leak(limit="1 MiB")
        def test_clean():
            pass
        """,
    )
    # A zero note threshold makes the clean test notable: its note must cross from a worker.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "-v", "--memreclaim-note-threshold=0"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*verdict: Python leak*",
            "*memreclaim: @no_leak*",
            "*retention notes*",
            "*test_work.py::test_clean: *",
        ]
    )


# ---- usage errors, help, markers: cheap, in-process -----------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        '"12 parsecs"',
        "-1",
        'limit="fast"',
        "limit=1.5",
        "repeat=0",
        "warmup=-2",
        "bogus=1",
        'trace="no"',
        "frames=0",
        "frames=1.5",
    ],
)
def test_junk_marker_arguments_are_usage_errors(pytester: pytest.Pytester, args: str) -> None:
    pytester.makepyfile(
        f"""
        import pytest
        RAN = []

        @pytest.mark.no_leak({args})
        def test_x():
            RAN.append(1)

        def test_not_run():
            assert RAN == []
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1, passed=1)
    result.stdout.fnmatch_lines(["*memreclaim usage error: *"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize(
    "option",
    [
        "--memreclaim-leak-limit=12 parsecs",
        "--memreclaim-noise-floor=-1",
        "--memreclaim-repeat=0",
        "--memreclaim-warmup=x",
    ],
)
def test_junk_command_line_is_a_usage_error(pytester: pytest.Pytester, option: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*memreclaim: --memreclaim-*"])


def test_junk_ini_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini(ASYNCIO_INI + "memreclaim_retained_limit = 12 parsecs\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*memreclaim: ini memreclaim_retained_limit: unknown unit*"])


def test_junk_fixture_arguments_raise_before_the_block(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_check(memory):
            ran = []
            with pytest.raises(ValueError, match="leak: unknown unit"):
                with memory.check(leak="12 parsecs"):
                    ran.append(1)
            assert ran == []
            with pytest.raises(ValueError, match="retained"):
                with memory.check(retained=-1):
                    ran.append(1)
            with pytest.raises(TypeError, match="leak"):
                memory.measure(lambda: None, leak=[1])
            with pytest.raises(ValueError, match="repeat"):
                memory.measure(lambda: None, repeat=0)
            assert ran == []
            assert memory.last is None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_options_in_help_and_markers_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "*memory leaks vs allocator retention (memreclaim)*",
            "*--memreclaim-leak-limit*",
            "*--memreclaim-retained-limit*",
            "*--memreclaim-repeat*",
            "*--memreclaim-warmup*",
            "*--memreclaim-noise-floor*",
            "*--memreclaim-note-threshold*",
            "*memreclaim_leak_limit*",
        ]
    )
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*no_leak(limit=None*", "*reclaims(limit=None*"])


def test_marker_trace_and_frames(pytester: pytest.Pytester) -> None:
    # trace=False: the test runs without tracemalloc and its 3 MiB bytearrays (malloc'd) are
    # judged as native memory, the report saying why there is no Python figure; frames=2 gives
    # traceback sites two frames deep.
    pytester.makepyfile(
        """
        import tracemalloc
        import pytest
        KEEP = []
        TRACING = []

        @pytest.mark.no_leak(trace=False)
        def test_untraced():
            TRACING.append(tracemalloc.is_tracing())
            KEEP.append(bytearray(3 * 1024 * 1024))

        def test_untraced_ran_untraced():
            assert TRACING == [False]

        def helper():
            for i in range(60000):
                KEEP.append(bytes(100) + bytes(i % 7))

        @pytest.mark.no_leak(frames=2)
        def test_two_frames():
            helper()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(failed=2, passed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*_ test_untraced _*", "*native leak (malloc)*", "*tracemalloc was off*"]
    )
    # The top site (helper's line) and one caller (the test's line), no deeper frame.
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if "test_marker_trace_and_frames.py:16:" in line)
    assert lines[top + 1].strip() == "called from test_marker_trace_and_frames.py:20", out
    assert "called from" not in lines[top + 2], out
    assert "ctypes" not in out, out  # memreclaim's own bindings are not the workload's sites


def test_command_line_default_limit_applies(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        KEEP = []

        @pytest.mark.no_leak
        def test_x():
            KEEP.append(bytearray(3 * 1024 * 1024))
        """
    )
    # 3 MiB kept: passes a 16 MiB default from the command line, fails the built-in 1 MiB.
    passed = pytester.runpytest("-p", "no:cacheprovider", "--memreclaim-leak-limit=16 MiB")
    passed.assert_outcomes(passed=1)
    failed = pytester.runpytest("-p", "no:cacheprovider")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*over the 1.0 MiB limit*"])


def test_unmarked_tests_are_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import tracemalloc
        KEEP = []

        def test_x():
            KEEP.append(bytearray(8 * 1024 * 1024))
            assert not tracemalloc.is_tracing()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA", "-v")
    result.assert_outcomes(passed=1)
    assert "memreclaim:" not in result.stdout.str()
    assert "diagnosis" not in result.stdout.str()


def test_notes_only_under_verbose(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.no_leak
        def test_x():
            pass
        """
    )
    # A zero threshold makes every measured test notable; the note appears only with -v.
    quiet = pytester.runpytest("-p", "no:cacheprovider", "--memreclaim-note-threshold=0")
    quiet.assert_outcomes(passed=1)
    assert "retention notes" not in quiet.stdout.str()
    verbose = pytester.runpytest("-p", "no:cacheprovider", "--memreclaim-note-threshold=0", "-v")
    verbose.assert_outcomes(passed=1)
    verbose.stdout.fnmatch_lines(["*memreclaim: retention notes*", "*::test_x: *"])


@pytest.mark.timeout(600)
def test_coexists_with_pytest_memray(pytester: pytest.Pytester) -> None:
    if importlib.util.find_spec("pytest_memray") is None:
        pytest.skip("pytest-memray not installed")
    make(
        pytester,
        """
        @pytest.mark.no_leak(limit="512 KiB", repeat=2)
        def test_native():
            p = libc.malloc(1 << 20)
            ctypes.memset(p, 1, 1 << 20)

        @pytest.mark.limit_memory("64 MB")
        @pytest.mark.no_leak(limit="1 MiB")
        def test_both_plugins_pass():
            bytearray(1024 * 1024)
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memray")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*memreclaim (@no_leak): leaked * per run (native*), over the 512.0 KiB limit*",
            "*verdict: native leak*",
            "*Allocation results for test_work.py::test_both_plugins_pass*",
        ]
    )


def test_plugin_is_declared_as_pytest11_entry_point() -> None:
    # Without `[project.entry-points.pytest11] memreclaim = "memreclaim.pytest_plugin"` in
    # pyproject.toml (and a reinstall), pytest never loads the plugin.
    from importlib.metadata import entry_points

    found = [ep.value for ep in entry_points(group="pytest11") if ep.name == "memreclaim"]
    assert found == ["memreclaim.pytest_plugin"]


# ---- the labelled scenarios through the marker and the fixture --------------------------------


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "alloc",
    [
        "glibc",
        "jemalloc",
        "tcmalloc",
        "mimalloc",
    ],
)
def test_scenarios_through_marker_and_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, alloc: str
) -> None:
    """The default scenarios (tests/scenarios) as test modules using ``@no_leak`` and
    ``memory.measure()`` with a 1-byte limit: leaks fail with their kind named first, the rest
    pass. The retention spike is left to test_scenarios.py and the retention tests above (one
    process runs every module here); ``MEMRECLAIM_SCENARIOS=all`` runs every scenario."""
    from conftest import allocator_lib
    from scenarios import LEAK_LABELS, PLUGIN_WORDS, SCENARIOS, pytest_code

    full = os.environ.get("MEMRECLAIM_SCENARIOS") == "all"
    chosen = {n: s for n, s in SCENARIOS.items() if full or (s.default and s.label != "retention")}
    for name, scenario in chosen.items():
        pytester.makepyfile(**{f"test_{name}": pytest_code(scenario)})
    if alloc == "glibc":
        monkeypatch.delenv("LD_PRELOAD", raising=False)
    else:
        monkeypatch.setenv("LD_PRELOAD", str(allocator_lib(alloc)))
    monkeypatch.setenv("COLUMNS", "1000")  # the -rA lines are cut to the terminal's width
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "-p", "no:xdist")
    lines = result.stdout.lines
    for name, scenario in chosen.items():
        for test in ("test_marker", "test_fixture"):
            node = f"test_{name}.py::{test}"
            if scenario.label in LEAK_LABELS:
                words = PLUGIN_WORDS[scenario.label]
                hits = [ln for ln in lines if ln.startswith(f"FAILED {node} - ")]
                assert hits and words in hits[0], f"{alloc} {node}:\n{result.stdout.str()}"
            else:
                assert f"PASSED {node}" in lines, f"{alloc} {node}:\n{result.stdout.str()}"


def test_repeat_calls_the_test_with_its_own_arguments(pytester: pytest.Pytester) -> None:
    """Warm-up and extra runs get what pytest passes: fixtures and parametrized arguments the
    function names, not autouse fixtures it does not name, and a default left as it is."""
    make(
        pytester,
        """
        SEEN = []

        @pytest.fixture(autouse=True)
        def hidden():
            return "autouse"

        @pytest.fixture
        def thing():
            return "fixture"

        @pytest.mark.parametrize("n", [7])
        @pytest.mark.no_leak(limit="64 MiB", repeat=2, warmup=1)
        def test_args(thing, n, tail="default"):
            SEEN.append((thing, n, tail))

        class TestMethod:
            @pytest.mark.no_leak(limit="64 MiB", repeat=2)
            def test_method(self, thing):
                SEEN.append(("method", thing))

        def test_saw_every_call():
            assert SEEN == [("fixture", 7, "default")] * 3 + [("method", "fixture")] * 2
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3)


@pytest.mark.timeout(600)
def test_leak_under_the_limit_is_summarised_and_strict_fails_it(pytester: pytest.Pytester) -> None:
    # A native leak of ~470 KiB per run (5,000 calls of 80 bytes) passes a 1 MiB limit, but is
    # listed in its own summary section without -rA; strict (marker or ini) fails it, per call.
    make(
        pytester,
        """
        def call():
            ctypes.memset(libc.malloc(80), 1, 80)

        @pytest.mark.no_leak(limit="1 MiB", repeat=5, warmup=1, calls=5000)
        def test_near():
            for _ in range(5000):
                call()

        @pytest.mark.no_leak(limit="1 MiB", repeat=5, warmup=1, calls=5000, strict=True)
        def test_near_strict():
            for _ in range(5000):
                call()

        @pytest.mark.no_leak(limit="1 MiB", repeat=3, warmup=1)
        @pytest.mark.reclaims(limit="64 MiB")
        def test_control():
            spike_000()
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*memreclaim (@no_leak): leaked * per run, * B per call (5000 per run) (native,"
            " malloc): a steady leak under the 1.0 MiB limit (strict)*",
            "*memreclaim: leaks under the limit*",
            "test_work.py::test_near: leaked * per run, * B per call (5000 per run) (native,"
            " malloc), under the 1.0 MiB limit; native leak (malloc)*",
        ]
    )
    summary = result.stdout.str().split("leaks under the limit")[1].split("short test summary")[0]
    assert "test_control" not in summary and "test_near_strict" not in summary
    strict = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "memreclaim_strict=true", "-k", "near"
    )
    strict.assert_outcomes(failed=2)


def test_marker_runs_and_calls_are_bounded(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        RUNS = []

        @pytest.mark.no_leak(warmup=2**70)
        def test_huge_warmup():
            RUNS.append(1)

        @pytest.mark.no_leak(calls=0, repeat=2)
        def test_no_calls():
            RUNS.append(1)

        def test_nothing_ran():
            assert RUNS == []
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(errors=2, passed=1)
    result.stdout.fnmatch_lines(
        ["*memreclaim usage error: warmup must be <= 100000*", "*calls must be >= 1*"]
    )
