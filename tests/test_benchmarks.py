"""benchmarks/run.py --quick runs end to end and its figures tell the seeds' stories."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from conftest import run_child

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    proc = run_child(
        [str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(out)], timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    return out, json.loads((out / "retention.json").read_text())


def rows(raw: dict[str, Any], case: str) -> dict[str, dict[str, Any]]:
    """label (with group) -> the first result of that variant."""
    return {
        (v["group"] + ": " if v["group"] else "") + v["label"]: v["results"][0]
        for v in raw["cases"][case]
    }


@pytest.mark.timeout(300)
def test_quick_run_writes_the_report(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, raw = quick_run
    text = (out / "retention.md").read_text()
    for title in ("## Seed 000", "## Seed 003", "## Seed 004", "## A real service"):
        assert title in text
    assert f"Python {raw['machine']['python']}, glibc {raw['machine']['glibc']}" in text
    assert "| glibc default |" in text
    assert "python benchmarks/cases/spike.py" in text  # every row comes with its command
    assert raw["quick"] is True and raw["repeat"] == 1


@pytest.mark.timeout(300)
def test_quick_spike_tells_retention(quick_run: tuple[Path, dict[str, Any]]) -> None:
    spike = rows(quick_run[1], "spike")
    glibc = spike["glibc default"]
    growth = glibc["peak"] - glibc["baseline"]
    held = glibc["after_free"] - glibc["baseline"]
    assert growth > 30 * MiB
    assert held > 0.8 * growth  # freed, yet resident
    assert glibc["after_trim"] - glibc["baseline"] < 0.4 * held  # trim gives it back
    assert glibc["baseline"] < glibc["physical_floor"] <= glibc["page_floor"]
    assert glibc["allocator"] == "glibc"
    if "jemalloc decay 0" in spike:
        je = spike["jemalloc decay 0"]
        assert je["allocator"] == "jemalloc"
        assert je["after_free"] - je["baseline"] < 0.5 * (je["peak"] - je["baseline"])


@pytest.mark.timeout(300)
def test_quick_buffers_pinned_threshold_stays_lower(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    buffers = rows(quick_run[1], "buffers")
    for shape in ("outputs dropped each round", "outputs kept 3 rounds"):
        default = buffers[f"{shape}: glibc default"]
        pinned = buffers[f"{shape}: glibc pin_mmap_threshold(64 KiB)"]
        assert len(default["per_round"]) == len(pinned["per_round"]) == 6
        assert pinned["final"] - pinned["baseline"] <= default["final"] - default["baseline"]
    # with outputs alive for 3 rounds, the adaptive threshold puts them on the heap
    default = buffers["outputs kept 3 rounds: glibc default"]
    pinned = buffers["outputs kept 3 rounds: glibc pin_mmap_threshold(64 KiB)"]
    assert pinned["final"] - pinned["baseline"] < 0.7 * (default["final"] - default["baseline"])


@pytest.mark.timeout(300)
def test_quick_shrink_counts_madvise_in_trim(quick_run: tuple[Path, dict[str, Any]]) -> None:
    raw = quick_run[1]
    if "shrink" not in raw["cases"]:
        pytest.skip("no C compiler")
    shrink = rows(raw, "shrink")
    kept = shrink["1 thread, no trim"]
    trimmed = shrink["1 thread, malloc_trim(0)"]
    assert kept["after_free"] > 0.9 * kept["after_malloc"]
    assert trimmed["after_trim"] < 0.3 * trimmed["after_free"]
    if shutil.which("strace") is not None:
        # one madvise per hole between kept blocks: about 1,000 for every 1000th of 1,000,000
        assert 500 < trimmed["madvise_during_trim"] < 2000
        assert kept["madvise_during_trim"] == 0


@pytest.mark.timeout(300)
def test_quick_service_runs_with_and_without_the_trimmer(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    service = rows(quick_run[1], "service")
    plain = service["glibc, no trimmer"]
    trimmed = service["glibc, memreclaim run"]
    for result in (plain, trimmed):
        assert result["peak"] - result["baseline"] > 50 * MiB  # the burst was served
        assert result["pings"] > 10
        assert result["ping_ms_p50"] <= result["ping_ms_max"]
    assert plain["trimmer_report"] == ""
    assert trimmed["trimmer_report"].startswith("memreclaim run:")
    assert " 0 trim(s)" not in trimmed["trimmer_report"]
    # The trimmer's run ends far below the plain run's retention. (Not `end < after_burst`: the
    # runners bound glibc's arena tops at start, so frees during the burst already give much back
    # and what is left at `after_burst` can be within noise of the end.)
    held_plain = plain["end"] - plain["baseline"]
    held_trimmed = trimmed["end"] - trimmed["baseline"]
    assert held_plain > 30 * MiB, held_plain  # the plain run retains: the case shows something
    assert held_trimmed < 0.5 * held_plain, (held_trimmed, held_plain)


@pytest.mark.timeout(300)
def test_quick_plots_are_pngs(quick_run: tuple[Path, dict[str, Any]]) -> None:
    pytest.importorskip("matplotlib")
    out = quick_run[0]
    for name in ("spike.png", "dicts.png", "buffers.png", "service.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 600 and height >= 200
        assert f"]({name})" in (out / "retention.md").read_text()


def test_bad_arguments_exit_2() -> None:
    proc = run_child([str(ROOT / "benchmarks" / "run.py"), "--repeat", "0"], timeout=60)
    assert proc.returncode == 2
    assert "--repeat must be at least 1" in proc.stderr
