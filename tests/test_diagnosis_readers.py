"""The diagnosis's readers in C (memreclaim._core.diag_*): their figures and failure modes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from memreclaim import _core

MiB = 1 << 20


def test_probe_address_is_a_block_of_this_allocator() -> None:
    address = _core.diag_probe_address(64)
    assert isinstance(address, int) and address > 0
    with pytest.raises(TypeError, match="size must be int"):
        _core.diag_probe_address("64")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _core.diag_probe_address(True)
    with pytest.raises(ValueError, match=r"1\.\.2"):
        _core.diag_probe_address(0)
    with pytest.raises(OverflowError):
        _core.diag_probe_address(-1)
    with pytest.raises(OverflowError):
        _core.diag_probe_address(1 << 80)


def test_anon_mappings_of_smaps(tmp_path: Path) -> None:
    smaps = tmp_path / "smaps"
    smaps.write_text(
        textwrap.dedent(
            """\
            55d0a0000000-55d0a0021000 rw-p 00000000 00:00 0                          [heap]
            Size:                132 kB
            Rss:                  12 kB
            7f0000000000-7f0000400000 rw-p 00000000 00:00 0
            Size:               4096 kB
            Rss:                1024 kB
            VmFlags: rd wr mr mw me ac sd
            7f0000400000-7f0000401000 r--p 00000000 08:01 1234                       /usr/lib/x.so
            Rss:                   4 kB
            7f0000500000-7f0000600000 rw-p 00000000 00:00 0
            Rss:                   0 kB
            """
        )
    )
    assert _core.diag_anon_mappings(smaps) == (
        (0x7F0000000000, 0x7F0000400000, 1024 * 1024),
        (0x7F0000500000, 0x7F0000600000, 0),
    )
    with pytest.raises(OSError) as missing:
        _core.diag_anon_mappings(tmp_path / "absent")
    assert missing.value.errno == errno.ENOENT
    with pytest.raises(TypeError):
        _core.diag_anon_mappings(7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="at most 1"):
        _core.diag_anon_mappings(None, None)  # type: ignore[call-arg]


def test_anon_mappings_of_smaps_with_a_header_longer_than_the_buffer(tmp_path: Path) -> None:
    # A mapping whose path is longer than the reader's line buffer: its fields (its Rss) are not
    # taken for the anonymous mapping before it.
    smaps = tmp_path / "smaps"
    long_path = "/" + "d" * 5000 + "/lib.so"
    smaps.write_text(
        "7f0000000000-7f0000400000 rw-p 00000000 00:00 0\n"
        "Rss:                1024 kB\n"
        f"7f0000400000-7f0000800000 rw-p 00000000 08:01 99 {long_path}\n"
        "Rss:                4096 kB\n"
        "7f0000800000-7f0000900000 rw-p 00000000 00:00 0\n"
        "Rss:                   8 kB\n"
    )
    assert _core.diag_anon_mappings(smaps) == (
        (0x7F0000000000, 0x7F0000400000, 1024 * 1024),
        (0x7F0000800000, 0x7F0000900000, 8 * 1024),
    )


def test_anon_mappings_of_this_process_hold_a_fresh_mmap() -> None:
    import mmap

    with mmap.mmap(-1, 8 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as area:
        area.write(b"x" * (4 * MiB))
        maps = _core.diag_anon_mappings()  # /proc/self/smaps
        assert all(low < high and rss >= 0 for low, high, rss in maps)
        assert any(high - low >= 8 * MiB and rss >= 4 * MiB for low, high, rss in maps), maps


def test_hold_blocks_keeps_them_until_released() -> None:
    held = _core.diag_hold_blocks(16, 1024)
    assert held is not None
    del held
    for bad in ((0, 16), (16, 0), (2_000_000, 16), (16, (1 << 20) + 1)):
        with pytest.raises(ValueError, match="count"):
            _core.diag_hold_blocks(*bad)
    with pytest.raises(TypeError, match="argument 1 must be int"):
        _core.diag_hold_blocks(1.0, 16)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes 2 arguments"):
        _core.diag_hold_blocks(16)  # type: ignore[call-arg]
    with pytest.raises(OverflowError):
        _core.diag_hold_blocks(1 << 80, 16)


def test_pymalloc_figures_with_and_without_tracemalloc() -> None:
    with pytest.raises(TypeError, match="tracing must be bool"):
        _core.diag_pymalloc(1)  # type: ignore[arg-type]
    plain = _core.diag_pymalloc(tracemalloc.is_tracing())
    assert plain is not None
    arenas, allocated = plain
    assert arenas > 0 and 0 < allocated <= arenas
    tracemalloc.start()
    try:
        hooked = _core.diag_pymalloc(True)
        keep = [{"n": i} for i in range(50_000)]
        grown = _core.diag_pymalloc(True)
        del keep
    finally:
        tracemalloc.stop()
    assert hooked is not None and grown is not None
    assert grown[1] - hooked[1] > 50_000 * 64  # the dicts live in pymalloc's blocks


def test_pymalloc_figures_are_none_without_pymalloc() -> None:
    code = "from memreclaim import _core; print(_core.diag_pymalloc(False))"
    env = dict(os.environ, PYTHONMALLOC="malloc")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "None"


def test_allocator_specific_readers_answer_for_their_allocator_only() -> None:
    name = _core.allocator()
    tcache = _core.diag_glibc_tcache()
    if name == "glibc":
        assert isinstance(tcache, int) and tcache >= 0  # glibc >= 2.33: mallinfo2
    else:
        assert tcache is None
    if name != "jemalloc":
        assert _core.diag_jemalloc_parts() is None
        assert _core.diag_jemalloc_flush() is False
    if name != "mimalloc":
        assert _core.diag_mimalloc_collect(True) is False
    with pytest.raises(TypeError, match="force must be bool"):
        _core.diag_mimalloc_collect(1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "lib"),
    [("jemalloc", "libjemalloc.so.2"), ("mimalloc", "libmimalloc.so.2")],
)
def test_readers_under_a_preloaded_allocator(name: str, lib: str) -> None:
    path = Path("/usr/lib/x86_64-linux-gnu") / lib
    if not path.exists():
        pytest.skip(f"{lib} is not installed")
    code = textwrap.dedent(
        """
        import ctypes
        from memreclaim import _core
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        print(_core.allocator())
        if _core.allocator() == "jemalloc":
            assert _core.diag_jemalloc_flush() is True
            small, large = _core.diag_jemalloc_parts()
            blocks = [libc.malloc(1 << 20) for _ in range(16)]
            _core.heap_stats()  # a new epoch
            assert _core.diag_jemalloc_parts()[1] - large >= 12 << 20
        else:
            maps = _core.diag_anon_mappings()
            block = _core.diag_probe_address(1 << 20)
            assert any(low <= block < high for low, high, _ in maps), (hex(block), maps)
            assert _core.diag_mimalloc_collect(True) is True
        assert _core.diag_glibc_tcache() is None
        """
    )
    env = dict(os.environ, LD_PRELOAD=str(path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == name
