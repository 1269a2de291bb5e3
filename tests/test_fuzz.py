"""Fuzz every public call's arguments with hypothesis, in a subprocess.

tests/stress/fuzz_surface.py feeds any Python object (None, huge ints, NaN, str and int
subclasses, objects whose dunders raise, nested containers), positionally and as keywords (the
real names, near misses, any text), to every public function. Each call must return a valid
result or raise an ordinary exception; SystemError or a crash fails. Running it in a subprocess
makes a segfault a failed test with faulthandler's traceback rather than a dead pytest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FUZZ = Path(__file__).resolve().parent / "stress" / "fuzz_surface.py"
try:
    import memreclaim._pools  # noqa: F401

    POOLS = 3
except ImportError:
    POOLS = 0
FUNCTIONS = 15 + POOLS  # the public calls fuzz_surface.py covers (+ memreclaim._pools's)


def fuzz(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, str(FUZZ), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the fuzz run did not finish within {timeout} s: {exc.stdout!r}")


def summary(proc: subprocess.CompletedProcess[str]) -> Any:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1])


@pytest.mark.timeout(300)
def test_any_object_in_any_argument_is_an_exception_or_a_valid_result() -> None:
    examples = 300
    proc = fuzz("--examples", str(examples))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    result = summary(proc)
    assert result["failures"] == 0
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


@pytest.mark.timeout(120)
def test_fuzz_harness_reports_a_crash() -> None:
    """The harness can fail: a target that segfaults on an int kills the child with SIGSEGV."""
    # Under the sanitizer job, ASan must let this deliberate segfault through unreported.
    env = {"ASAN_OPTIONS": "detect_leaks=0:handle_segv=0"} if "ASAN_OPTIONS" in os.environ else None
    proc = fuzz(
        "--examples", "50", "--only", "crash canary", "--crash-canary", timeout=100, env=env
    )
    assert proc.returncode == -signal.SIGSEGV, proc.returncode
    assert "Segmentation fault" in proc.stderr
