"""Fuzz every public call's arguments with hypothesis, in a subprocess.

tests/stress/fuzz_surface.py feeds any Python object (None, huge ints, NaN, str and int
subclasses, objects whose dunders raise, nested containers), positionally and as keywords (the
real names, near misses, any text), to every public function. Each call must return a valid
result or raise an ordinary exception; SystemError or a crash fails. Running it in a subprocess
makes a segfault a failed test with faulthandler's traceback rather than a dead pytest.

A run is a fixed number of cases from a fixed seed: $MEMRECLAIM_FUZZ_SEED (default 0, shown in
pytest's header and in every failure message), not a time budget; the time bound below only
turns a hang into a failure that says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_child

FUZZ = Path(__file__).resolve().parent / "stress" / "fuzz_surface.py"
try:
    import memreclaim._pools  # noqa: F401

    POOLS = 3
except ImportError:
    POOLS = 0
FUNCTIONS = 15 + POOLS  # the public calls fuzz_surface.py covers (+ memreclaim._pools's)


SEED = os.environ.get("MEMRECLAIM_FUZZ_SEED", "0")
# A bound for a hang, far above a run's length (about a minute here, several under ASan).
HANG = 1200


def fuzz(*args: str, timeout: float = HANG, **options: Any) -> subprocess.CompletedProcess[str]:
    # LD_PRELOAD is kept: under tools/sanitize.sh it is the ASan runtime
    return run_child(
        [str(FUZZ), "--seed", SEED, *args], timeout=timeout, keep_preload=True, **options
    )


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    """What failed, for the assertion message: the seed, the failing functions, the stderr."""
    return (
        f"fuzz seed {SEED} (MEMRECLAIM_FUZZ_SEED) exited {proc.returncode}\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def summary(proc: subprocess.CompletedProcess[str]) -> Any:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, explain(proc)
    return json.loads(lines[-1])


@pytest.mark.timeout(HANG + 60)
def test_any_object_in_any_argument_is_an_exception_or_a_valid_result() -> None:
    examples = 300
    proc = fuzz("--examples", str(examples))
    assert proc.returncode == 0, explain(proc)
    result = summary(proc)
    assert result["seed"] == int(SEED)
    assert result["failures"] == 0, (result["failed"], explain(proc))
    calls_per_function: dict[str, int] = {}
    for key, count in result["outcomes"].items():
        name = key.split(": ")[0]
        calls_per_function[name] = calls_per_function.get(name, 0) + count
    assert len(calls_per_function) == FUNCTIONS, calls_per_function
    # Hypothesis stops early only when it has run out of distinct inputs (zero-argument calls).
    assert result["calls"] >= FUNCTIONS * examples * 0.9
    outcomes = set(result["outcomes"])
    # The fuzz reached the success paths and the argument checks, not only arity errors.
    for expected in (
        "trim: ok",
        "stats: ok",
        "rss: ok",
        "parse_bytes: ok",
        "parse_bytes: ValueError",
        "pin_mmap_threshold: ValueError",
        "set_trim_threshold: TypeError",
    ):
        assert expected in outcomes, (expected, sorted(outcomes))


@pytest.mark.timeout(HANG + 60)
def test_fuzz_harness_reports_a_crash() -> None:
    """The harness can fail: a target that segfaults on an int kills the child with SIGSEGV."""
    # Under the sanitizer job, ASan must let this deliberate segfault through unreported.
    env = {"ASAN_OPTIONS": "detect_leaks=0:handle_segv=0"} if "ASAN_OPTIONS" in os.environ else None
    proc = fuzz("--examples", "50", "--only", "crash canary", "--crash-canary", env=env)
    assert proc.returncode == -signal.SIGSEGV, explain(proc)
    assert "Segmentation fault" in proc.stderr, explain(proc)


def test_same_seed_same_cases_and_a_failure_says_what_failed() -> None:
    """A fixed seed draws the same cases; a failing function is named, with its exception."""
    runs = [fuzz("--examples", "30", "--only", "parse_bytes") for _ in range(2)]
    assert all(proc.returncode == 0 for proc in runs), [explain(proc) for proc in runs]
    assert summary(runs[0])["outcomes"] == summary(runs[1])["outcomes"]
    assert runs[0].stdout.startswith(f"fuzz seed {SEED}, 30 examples per function")
    proc = fuzz("--examples", "50", "--only", "failing canary", "--failing-canary")
    assert proc.returncode == 1, explain(proc)
    failed = summary(proc)["failed"]
    assert list(failed) == ["failing canary"], failed
    assert failed["failing canary"].startswith("SystemError: canary: an int arrived"), failed
    # hypothesis's minimal example is shown ("Falsifying example", "Failing test case" in 6.x)
    assert "Falsifying example" in proc.stderr or "Failing test case" in proc.stderr, explain(proc)
