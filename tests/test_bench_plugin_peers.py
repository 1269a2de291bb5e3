"""benchmarks/bench_plugin_peers.py: the table and the arguments (the runs themselves are the
benchmark's: minutes, and pytest-memray/psleak installed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_plugin_peers as bench


def test_table_counts_right_verdicts_and_totals() -> None:
    rows: list[dict[str, object]] = []
    for case, leaks in (("leak", True), ("control", False)):
        for tool, outcome, seconds in (
            ("memreclaim", "failed", 3.0),
            ("pytest-memray", "passed", 2.0),
        ):
            rows.append(
                {
                    "case": case,
                    "leaks": leaks,
                    "tool": tool,
                    "outcomes": [outcome],
                    "right": int((outcome == "failed") == leaks),
                    "runs": 1,
                    "seconds": seconds,
                }
            )
    rows[0]["named"] = True  # memreclaim's leak report named the culprit
    text = bench.table(rows, 1, ("0.10", "0.20"))
    assert "| leak | yes | 1/1, 3.0 s, names it | 0/1 (passed), 2.0 s |" in text
    assert "| control | no | 0/1 (failed), 3.0 s | 1/1, 2.0 s |" in text
    assert "| **total wall time** | | 6.0 s | 4.0 s |" in text
    assert "memreclaim / pytest-memray total wall time: 1.50x." in text
    assert "before:\n0.10, after: 0.20" in text


def test_every_case_has_a_work_function() -> None:
    for case in bench.CASES:
        assert "def work()" in case.code, case.name
    assert {c.leaks for c in bench.CASES} == {True, False}


def test_bad_repeat_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--repeat", "0"])
    assert exc.value.code == 2
