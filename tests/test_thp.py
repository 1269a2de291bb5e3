"""Transparent huge pages: the settings readers, stats()' fields, and the heap marking trim() does
under THP ``always``.

No test changes /sys (other tests run in parallel): the readers are checked against the real
files as they are and against synthetic directories; the choice of ranges against synthetic maps
files; the marking by calling its entry point in a fresh interpreter and reading VmFlags.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import memreclaim
from memreclaim import _core

MiB = 1 << 20


def _settings() -> dict[str, Any]:
    """thp_settings() as the dict it returned before 0.3 (asdict of the ThpSettings)."""
    return memreclaim.asdict(_core.thp_settings())


def _settings_at(directory: str | Path) -> dict[str, Any]:
    return memreclaim.asdict(_core._thp_settings_at(directory))


SYSFS = Path("/sys/kernel/mm/transparent_hugepage")


def bracketed(path: Path) -> str | None:
    """The bracketed word of a THP file, read without memreclaim; None if it is missing."""
    if not path.exists():
        return None
    match = re.search(r"\[([^\]]+)\]", path.read_text())
    assert match is not None, path
    return match.group(1)


def number(path: Path) -> int | None:
    return int(path.read_text()) if path.exists() else None


def expected_mode(enabled: str | None, pmd_enabled: str | None) -> str | None:
    if enabled is None:
        return None
    return pmd_enabled if pmd_enabled not in (None, "inherit") else enabled


def fake_sysfs(
    root: Path,
    *,
    enabled: str | None = "always [madvise] never",
    defrag: str | None = "always defer defer+madvise [madvise] never",
    pmd: str | None = "always [inherit] madvise never",
    max_ptes_none: str | None = "511",
    scan_sleep: str | None = "10000",
) -> Path:
    """A directory laid out like /sys/kernel/mm/transparent_hugepage (None: file left out)."""
    files = {
        "enabled": enabled,
        "defrag": defrag,
        "hpage_pmd_size": "2097152" if pmd is not None else None,
        "hugepages-2048kB/enabled": pmd,
        "khugepaged/max_ptes_none": max_ptes_none,
        "khugepaged/scan_sleep_millisecs": scan_sleep,
    }
    for name, text in files.items():
        if text is not None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text + "\n")
    return root


# ---- settings readers ------------------------------------------------------------------------


def test_settings_match_the_real_files() -> None:
    settings = _settings()
    pmd_size = number(SYSFS / "hpage_pmd_size")
    pmd_enabled = (
        bracketed(SYSFS / f"hugepages-{pmd_size // 1024}kB" / "enabled") if pmd_size else None
    )
    enabled = bracketed(SYSFS / "enabled")
    assert settings == {
        "mode": expected_mode(enabled, pmd_enabled),
        "enabled": enabled,
        "pmd_enabled": pmd_enabled,
        "defrag": bracketed(SYSFS / "defrag"),
        "pmd_size": pmd_size,
        "max_ptes_none": number(SYSFS / "khugepaged" / "max_ptes_none"),
        "scan_sleep_millisecs": number(SYSFS / "khugepaged" / "scan_sleep_millisecs"),
    }
    assert settings == _settings_at(str(SYSFS))


def test_settings_are_a_struct_sequence(tmp_path: Path) -> None:
    settings = _core._thp_settings_at(fake_sysfs(tmp_path))
    assert isinstance(settings, _core.ThpSettings) and isinstance(settings, tuple)
    assert type(_core.thp_settings()) is _core.ThpSettings
    assert (settings.mode, settings.pmd_enabled) == ("madvise", "inherit")
    assert settings.pmd_size == 2 * MiB
    assert list(memreclaim.asdict(settings)) == list(_core.ThpSettings.__match_args__)


def test_settings_synthetic(tmp_path: Path) -> None:
    assert _settings_at(fake_sysfs(tmp_path)) == {
        "mode": "madvise",
        "enabled": "madvise",
        "pmd_enabled": "inherit",
        "defrag": "madvise",
        "pmd_size": 2 * MiB,
        "max_ptes_none": 511,
        "scan_sleep_millisecs": 10000,
    }


@pytest.mark.parametrize(
    ("enabled", "pmd", "mode"),
    [
        ("[always] madvise never", "always [inherit] madvise never", "always"),
        ("always madvise [never]", "[always] inherit madvise never", "always"),  # per-size wins
        ("[always] madvise never", "always inherit madvise [never]", "never"),
        ("always [madvise] never", None, "madvise"),  # before 6.8: no per-size settings
    ],
)
def test_mode_is_the_one_governing_pmd_pages(
    tmp_path: Path, enabled: str, pmd: str | None, mode: str
) -> None:
    assert _settings_at(fake_sysfs(tmp_path, enabled=enabled, pmd=pmd))["mode"] == mode


def test_missing_files_are_none_not_zero(tmp_path: Path) -> None:
    """A kernel without THP has no directory: every figure None, never 0."""
    assert set(_settings_at(tmp_path / "absent").values()) == {None}
    partial = _settings_at(fake_sysfs(tmp_path, max_ptes_none=None, scan_sleep=None))
    assert partial["max_ptes_none"] is None and partial["scan_sleep_millisecs"] is None
    assert partial["mode"] == "madvise"


@pytest.mark.parametrize(
    ("kwargs", "bad_file"),
    [
        ({"enabled": "always madvise never"}, "enabled"),  # no bracketed word
        ({"defrag": "[]"}, "defrag"),
        ({"max_ptes_none": "many"}, "khugepaged/max_ptes_none"),
        ({"scan_sleep": "-1"}, "khugepaged/scan_sleep_millisecs"),
        ({"pmd": "always inherit madvise never"}, "hugepages-2048kB/enabled"),
    ],
)
def test_malformed_file_is_an_oserror_naming_it(
    tmp_path: Path, kwargs: dict[str, str], bad_file: str
) -> None:
    root = fake_sysfs(tmp_path, **kwargs)
    with pytest.raises(OSError) as caught:
        _settings_at(str(root))
    assert caught.value.errno == errno.EIO
    assert caught.value.filename == f"{root}/{bad_file}"


def test_unreadable_file_says_why(tmp_path: Path) -> None:
    """A file that exists but cannot be read (here a directory, whatever the user) -> errno."""
    root = fake_sysfs(tmp_path, enabled=None)
    (root / "enabled").mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        _settings_at(root)
    assert caught.value.filename == f"{root}/enabled"


def test_settings_bad_arguments() -> None:
    with pytest.raises(TypeError):
        _core.thp_settings(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _core._thp_settings_at(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _settings_at("a\0b")


# ---- stats() and TrimResult ---------------------------------------------------------------------


def rollup_huge() -> int:
    text = Path("/proc/self/smaps_rollup").read_text()
    match = re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.M)
    assert match is not None
    return int(match.group(1)) * 1024


def test_stats_reports_mode_and_anon_huge_pages() -> None:
    assert memreclaim.stats().anon_huge_pages is None  # it walks the page tables: heap=True
    before = rollup_huge()
    st = memreclaim.stats(heap=True)
    after = rollup_huge()
    assert st.thp_mode == _settings()["mode"]
    if st.thp_mode is None:
        assert st.anon_huge_pages is None
    else:
        assert st.anon_huge_pages is not None
        assert min(before, after) <= st.anon_huge_pages <= max(before, after)
    # The fields come last: the old indexes stay.
    assert tuple(st)[13:] == (st.thp_mode, st.anon_huge_pages)


def test_trim_reports_what_it_did_for_the_mode() -> None:
    result = memreclaim.trim()
    assert tuple(result)[13:] == (result.thp_mode, result.thp_marked, result.thp_reason)
    assert result.thp_mode == _settings()["mode"]
    if result.thp_mode == "always":
        assert result.thp_marked is not None and result.thp_marked > 0
    else:
        assert result.thp_marked == 0  # nothing to do: the mode says why
    assert result.thp_reason is None


def test_set_thp_marking_bad_input_changes_nothing() -> None:
    for bad in (1, None, "no"):
        with pytest.raises(TypeError):
            _core.set_thp_marking(bad)  # type: ignore[arg-type]
    assert _core.set_thp_marking(True) is True  # still the default


def test_marking_turned_off_is_said(run_python: Callable[..., dict[str, Any]]) -> None:
    out = run_python(
        """
        from memreclaim import _core
        previous = _core.set_thp_marking(False)
        r = memreclaim.trim()
        emit(previous=previous, now=_core.set_thp_marking(True), mode=r.thp_mode,
             marked=r.thp_marked, reason=r.thp_reason)
        """
    )
    assert out["previous"] is True and out["now"] is False
    if out["mode"] == "always":
        assert out["marked"] is None and "set_thp_marking(False)" in out["reason"]
    else:
        assert out["marked"] == 0 and out["reason"] is None


# ---- which ranges are the heap's ----------------------------------------------------------------

HEAP_ALIGN = 64 * MiB  # glibc's HEAP_MAX_SIZE on 64-bit


def line(start: int, end: int, perms: str = "rw-p", name: str = "", inode: int = 0) -> str:
    dev = "00:00" if inode == 0 else "fe:00"
    return f"{start:x}-{end:x} {perms} 00000000 {dev} {inode:<26d} {name}".rstrip() + "\n"


def test_heap_ranges_rule(tmp_path: Path) -> None:
    base = 0x7F0000000000
    chosen = [
        (0x555500000000, 0x555500000000 + 300 * MiB),  # [heap]
        (base, base + 40 * MiB),  # a thread-arena heap (64 MiB-aligned)...
        (base + 64 * MiB, base + 100 * MiB),  # ...and the next, above a small ---p tail
        (base + 200 * MiB, base + 210 * MiB),  # an unnamed anonymous mapping
        (base + 220 * MiB, base + 230 * MiB),  # glibc 2.40's decorated arena
    ]
    text = "".join(
        [
            line(0x555400000000, 0x555400001000, "r--p", "/usr/bin/python3", 42),
            line(*chosen[0], name="[heap]"),
            line(*chosen[1]),
            line(base + 40 * MiB, base + 64 * MiB - 4096, "---p"),
            line(base + 64 * MiB - 4096, base + 64 * MiB, "---p"),
            line(*chosen[2]),
            line(base + 100 * MiB, base + 128 * MiB, "---p"),
            line(*chosen[3]),
            line(*chosen[4], name="[anon: glibc: malloc arena]"),
            # not chosen:
            line(base + 240 * MiB, base + 241 * MiB),  # holds no aligned 2 MiB page
            line(base + 242 * MiB + 4096, base + 244 * MiB + 4096),  # 2 MiB, not aligned
            line(base + 250 * MiB, base + 250 * MiB + 4096, "---p"),  # a thread stack's guard
            line(base + 250 * MiB + 4096, base + 258 * MiB + 4096),  # ... and the stack
            line(base + 260 * MiB, base + 270 * MiB, "rwxp"),  # JIT code
            line(base + 270 * MiB, base + 280 * MiB, "rw-s", "/dev/zero (deleted)", 7),  # shmem
            line(base + 280 * MiB, base + 290 * MiB, "rw-p", "/tmp/data", 9),  # a file
            line(base + 290 * MiB, base + 300 * MiB, "rw-p", "[anon:v8 heap]"),  # not malloc's
            line(base + 300 * MiB, base + 310 * MiB, "rw-p", "/x" * 3000, 11),  # a long path
            line(0x7FFF00000000, 0x7FFF00000000 + 8 * MiB, name="[stack]"),
            line(0xFFFFFFFFFF600000, 0xFFFFFFFFFF601000, "--xp", "[vsyscall]"),
        ]
    )
    maps = tmp_path / "maps"
    maps.write_text(text)
    assert _core._thp_heap_ranges(str(maps), 2 * MiB) == chosen
    # With 1 GiB pages none of them holds a whole aligned page.
    assert _core._thp_heap_ranges(str(maps), 1 << 30) == []
    # The last line need not end with a newline.
    maps.write_text(line(*chosen[3]).rstrip("\n"))
    assert _core._thp_heap_ranges(str(maps), 2 * MiB) == [chosen[3]]


def test_heap_ranges_bad_input(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("this is not a maps line\n")
    with pytest.raises(OSError) as caught:
        _core._thp_heap_ranges(str(maps), 2 * MiB)
    assert caught.value.errno == errno.EIO
    with pytest.raises(FileNotFoundError):
        _core._thp_heap_ranges(str(tmp_path / "absent"), 2 * MiB)
    with pytest.raises(ValueError):
        _core._thp_heap_ranges(str(maps), 3 * MiB)
    with pytest.raises(ValueError):
        _core._thp_heap_ranges(str(maps), 0)
    with pytest.raises(TypeError):
        _core._thp_heap_ranges(str(maps), 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _core._thp_heap_ranges(str(maps))  # type: ignore[call-arg]


# ---- the marking, for real ----------------------------------------------------------------------

MARK_CHILD = """
import threading, time
from memreclaim import _core

def vmflags():
    flags, current = {}, None
    with open("/proc/self/smaps") as f:
        for text in f:
            head = text.split()
            if "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                current = (start, end, head[5] if len(head) > 5 else "")
            elif head[0] == "VmFlags:":
                flags[current] = head[1:]
    return flags

def arena_spike(ready, stop):
    kept = workloads.spike(30_000)  # glibc gives this thread an arena of its own
    ready.set()
    stop.wait()

ready, stop = threading.Event(), threading.Event()
worker = threading.Thread(target=arena_spike, args=(ready, stop))
worker.start()
ready.wait()
kept = workloads.spike()
trimmed = memreclaim.trim()
before = vmflags()
chosen = _core._thp_heap_ranges("/proc/self/maps", _core.thp_settings().pmd_size or 2 << 20)
marked = memreclaim.asdict(_core._thp_mark_heap())
after = vmflags()
# The worker's stack pointer, while it waits in a futex: /proc/self/task/TID/syscall.
sp, deadline = None, time.monotonic() + 60
while sp is None and time.monotonic() < deadline:
    fields = open(f"/proc/self/task/{worker.native_id}/syscall").read().split()
    if len(fields) > 3:
        sp = int(fields[-2], 16)
    else:
        time.sleep(0.01)
stop.set()
worker.join()
heap = [(s, e) for (s, e, name) in after if name == "[heap]"]
emit(
    mode=trimmed.thp_mode,
    trim_marked=trimmed.thp_marked,
    chosen=chosen,
    marked=marked,
    heap=heap,
    nh_before=[[s, e] for (s, e, n), f in before.items() if "nh" in f and n != "[stack]"],
    nh_after=[[s, e, "nh" in f] for (s, e, n), f in after.items()],
    stack=[[s, e] for (s, e, n) in after if n == "[stack]"],
    arenas=[[s, e] for (s, e) in chosen if s % (64 << 20) == 0],
    sp=sp,
)
"""


def test_marking_sets_nohugepage_on_the_heap(run_python: Callable[..., dict[str, Any]]) -> None:
    """After a spike (main thread and a thread arena) and a trim, the marking entry point sets
    VmFlags 'nh' on every range it chose, the [heap] and the thread's arena heap among them, and
    on no stack."""
    out = run_python(MARK_CHILD, timeout=300)
    chosen = [tuple(r) for r in out["chosen"]]
    assert out["marked"]["ranges"] == len(chosen) and out["marked"]["skipped"] == 0
    assert out["marked"]["bytes"] == sum(e - s for s, e in chosen)
    heap = [tuple(r) for r in out["heap"]]
    assert heap and all(r in chosen for r in heap), (heap, chosen)
    assert out["arenas"], "the worker's arena heap (64 MiB-aligned) was not chosen"

    def marked(start: int, end: int) -> bool:
        """Every mapping overlapping [start, end) is nh (marking may merge neighbours)."""
        return all(nh for s, e, nh in out["nh_after"] if s < end and e > start)

    for start, end in chosen:
        assert marked(start, end), f"{start:x}-{end:x} is not marked nh"
    # The marked ranges are most of what the heap maps (the spike made ~370 MiB of it).
    assert out["marked"]["bytes"] >= 10 * sum(e - s for s, e in heap) // 11
    # No stack: neither the main thread's nor the worker's (found by its stack pointer).
    for start, end in out["stack"]:
        assert not marked(start, end) or [start, end] in out["nh_before"]
        assert (start, end) not in chosen
    assert out["sp"] is not None, "the worker's stack pointer was never readable"
    assert not any(s <= out["sp"] < e for s, e in chosen), "a thread stack was chosen"
    # trim() itself marks only under THP 'always'.
    if out["mode"] == "always":
        assert out["trim_marked"] > 0
    else:
        assert out["trim_marked"] == 0
        assert all([s, e] not in out["nh_before"] for s, e in heap), "trim() marked the heap"


def test_mark_entry_point_takes_no_arguments() -> None:
    with pytest.raises(TypeError):
        _core._thp_mark_heap(1)  # type: ignore[call-arg]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="no /proc/self/smaps")
def test_marking_keeps_the_contents(run_python: Callable[..., dict[str, Any]]) -> None:
    """madvise(MADV_NOHUGEPAGE) changes flags only: every survivor reads back as it was."""
    out = run_python(
        """
        from memreclaim import _core
        kept = workloads.spike()
        digest = hash(tuple(kept))
        memreclaim.trim()
        _core._thp_mark_heap()
        emit(same=hash(tuple(kept)) == digest and all(s[0] == "x" * len(s[0]) for s in kept))
        """
    )
    assert out["same"]


# ---- trim() and stats() against a THP mode of our own, in a private mount namespace -------------

NAMESPACE_PRELUDE = """
import json, os, warnings
import memreclaim
from memreclaim import _core, workloads

def heap_nh():
    flags, name = [], None
    with open("/proc/self/smaps") as f:
        for text in f:
            head = text.split()
            if "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else ""
            elif head[0] == "VmFlags:" and name == "[heap]":
                flags.append("nh" in head[1:])
    return flags

def emit(**values):
    print("RESULT " + json.dumps(values), flush=True)
"""


def in_fake_sysfs(fake: Path, code: str) -> dict[str, Any]:
    """Run code in a fresh interpreter that sees ``fake`` as /sys/kernel/mm/transparent_hugepage:
    a bind mount in a mount namespace of its own (``unshare -m``, or ``-rm`` when not root), so
    the system's THP settings, which other tests share, are never touched."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) (util-linux)")
    script = 'mount --bind "$0" /sys/kernel/mm/transparent_hugepage && exec "$1" -c "$2"'
    flags = "-m" if os.geteuid() == 0 else "-rm"
    probe = subprocess.run(
        [unshare, flags, "sh", "-c", script, str(fake), sys.executable, "pass"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount in a private mount namespace: {probe.stderr.strip()}")
    proc = subprocess.run(
        [unshare, flags, "sh", "-c", script, str(fake), sys.executable,
         NAMESPACE_PRELUDE + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert results, proc.stdout + proc.stderr
    out: dict[str, Any] = json.loads(results[-1][len("RESULT ") :])
    return out


def test_trim_marks_the_heap_under_always(tmp_path: Path) -> None:
    fake = fake_sysfs(tmp_path, enabled="[always] madvise never")
    out = in_fake_sysfs(
        fake,
        """
        kept = workloads.spike()
        before = heap_nh()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = memreclaim.trim()
        emit(mode=r.thp_mode, marked=r.thp_marked, reason=r.thp_reason, before=before,
             after=heap_nh(), heap=_core.process_heap_mapping(os.getpid()),
             stats_mode=memreclaim.stats().thp_mode, warnings=[str(w.message) for w in caught])
        """,
    )
    assert out["mode"] == "always" and out["stats_mode"] == "always"
    assert out["before"] and not any(out["before"]), "the heap was nh before the trim"
    assert out["after"] and all(out["after"]), "trim() did not mark the [heap] nh"
    assert out["marked"] >= out["heap"] and out["reason"] is None and out["warnings"] == []


def test_trim_with_marking_off_says_so_under_always(tmp_path: Path) -> None:
    fake = fake_sysfs(tmp_path, enabled="[always] madvise never")
    out = in_fake_sysfs(
        fake,
        """
        _core.set_thp_marking(False)
        kept = workloads.spike()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = memreclaim.trim()
        emit(marked=r.thp_marked, reason=r.thp_reason, after=heap_nh(),
             warnings=[str(w.message) for w in caught])
        """,
    )
    assert out["marked"] is None and "set_thp_marking(False)" in out["reason"]
    assert not any(out["after"]) and out["warnings"] == []  # asked for: said, not warned


def test_unreadable_mode_is_said_and_warned_once(tmp_path: Path) -> None:
    fake = fake_sysfs(tmp_path, enabled=None)
    (fake / "enabled").mkdir()
    out = in_fake_sysfs(
        fake,
        """
        kept = workloads.spike(20_000)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = [memreclaim.trim() for _ in range(2)]
            stats = [memreclaim.stats(heap=True) for _ in range(2)]
        emit(trims=[[r.thp_mode, r.thp_marked, r.thp_reason] for r in results],
             stats=[[s.thp_mode, s.anon_huge_pages] for s in stats], after=heap_nh(),
             warnings=[[w.category.__name__, str(w.message)] for w in caught])
        """,
    )
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    for mode, marked, reason in out["trims"]:
        assert mode is None and marked is None and path in reason and "Is a directory" in reason
    assert not any(out["after"])
    assert [s[0] for s in out["stats"]] == [None, None]
    assert all(isinstance(s[1], int) for s in out["stats"])  # AnonHugePages is still read
    # Once for trim(), once for stats(): each says why.
    assert [w[0] for w in out["warnings"]] == ["RuntimeWarning", "RuntimeWarning"]
    assert all(path in w[1] for w in out["warnings"]), out["warnings"]


def test_no_thp_in_the_kernel_is_none(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = in_fake_sysfs(
        empty,
        """
        r = memreclaim.trim()
        s = memreclaim.stats()
        emit(trim=[r.thp_mode, r.thp_marked, r.thp_reason], stats=[s.thp_mode, s.anon_huge_pages],
             settings=memreclaim.asdict(_core.thp_settings()))
        """,
    )
    assert out["trim"] == [None, 0, None]  # nothing to mark: no THP
    assert out["stats"] == [None, None]
    assert set(out["settings"].values()) == {None}
