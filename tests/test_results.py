"""One dict form for every result (``memreclaim.asdict``) and ``memreclaim.inspect(pid)``."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import ready_child

import memreclaim
from memreclaim import _core, _process

MiB = 1 << 20


def test_asdict_of_a_trim_result_has_every_field_in_order() -> None:
    result = memreclaim.trim()
    data = memreclaim.asdict(result)
    assert list(data) == list(memreclaim.TrimResult.__match_args__)
    assert data == {name: getattr(result, name) for name in data}
    assert data["parts"] is not result.parts  # a copy: changing it changes nothing
    json.dumps(data)


def test_asdict_turns_nested_results_and_copies_dicts() -> None:
    st = memreclaim.stats(heap=True)
    data = memreclaim.asdict(st)
    assert list(data) == list(memreclaim.MemoryStats.__match_args__)
    assert data["heap"] == {
        name: getattr(st.heap, name) for name in memreclaim.HeapStats.__match_args__
    }
    assert data["heap"]["figures"] is not st.heap.figures  # type: ignore[union-attr]
    assert data["libraries"] == st.libraries and data["libraries"] is not st.libraries
    json.dumps(data)


def test_collect_thread_returns_a_collect_result_whose_dict_keeps_the_old_keys() -> None:
    # collect_thread() returned a dict before 0.3; asdict() gives the same keys back.
    result = memreclaim.collect_thread()
    assert isinstance(result, _core.CollectResult) and isinstance(result, tuple)
    data = memreclaim.asdict(result)
    assert list(data) == ["method", "anon_before", "anon_after", "seconds"]
    expected = "none" if memreclaim.allocator() in ("glibc", "unknown") else result.method
    assert result.method == expected and result.method != ""
    assert result.anon_before is not None and result.anon_before > 0
    assert result.seconds >= 0
    json.dumps(data)
    with pytest.raises(TypeError):
        memreclaim.collect_thread(abandon="yes")  # type: ignore[arg-type]


def test_asdict_of_dataclasses_and_named_tuples() -> None:
    @dataclasses.dataclass(frozen=True)
    class Inner:
        a: int
        b: tuple[int, ...]

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner
        items: tuple[Inner, ...]
        extra: dict[str, Inner]

    Pair = collections.namedtuple("Pair", ["left", "right"])
    outer = Outer(Inner(1, (2, 3)), (Inner(4, ()),), {"k": Inner(5, (6,))})
    assert memreclaim.asdict(outer) == {
        "inner": {"a": 1, "b": [2, 3]},
        "items": [{"a": 4, "b": []}],
        "extra": {"k": {"a": 5, "b": [6]}},
    }
    assert memreclaim.asdict(Pair(1, Inner(2, ()))) == {"left": 1, "right": {"a": 2, "b": []}}
    st = os.stat(".")  # a struct sequence with fields past the tuple (st_atime, ...)
    data = memreclaim.asdict(st)
    assert data["st_size"] == st.st_size and data["st_mtime"] == st.st_mtime
    assert list(data)[: len(os.stat_result.__match_args__)] == list(os.stat_result.__match_args__)
    limits = memreclaim.limits()
    data = memreclaim.asdict(limits)
    assert list(data) == [field.name for field in dataclasses.fields(limits)]
    assert data["limit"] == limits.limit and data["notes"] == list(limits.notes)  # tuple: list
    json.dumps(data)


@pytest.mark.parametrize(
    "value",
    [None, 1, "text", (1, 2), [1], {"a": 1}, memreclaim.TrimResult],
)
def test_asdict_refuses_what_is_not_a_result(value: object) -> None:
    with pytest.raises(TypeError, match="asdict\\(\\) takes a result"):
        memreclaim.asdict(value)


def test_asdict_of_a_dataclass_class_is_refused() -> None:
    @dataclasses.dataclass
    class Plain:
        x: int = 0

    with pytest.raises(TypeError, match="not type"):
        memreclaim.asdict(Plain)
    assert memreclaim.asdict(Plain()) == {"x": 0}


# ---------------------------------------------------------------- inspect


@pytest.fixture
def holder() -> Any:
    """A child process holding ~64 MiB of anonymous memory, until the test ends."""
    code = "import time; b = b'x' * (64 << 20); print('ready', flush=True); time.sleep(60)"
    with ready_child(code) as proc:
        yield proc


def test_inspect_another_process(holder: Any) -> None:
    info = memreclaim.inspect(holder.pid)
    assert isinstance(info, _process.ProcessMemory)
    assert info.pid == holder.pid and info.name.startswith("python")
    assert info.rss_anon is not None and info.rss_anon > 60 * MiB
    assert info.rss == info.rss_anon + (info.rss_file or 0) + (info.rss_shmem or 0)
    assert info.anonymous is not None and info.anonymous > 60 * MiB  # smaps_rollup
    assert info.notes == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rss = 0  # type: ignore[misc]
    data = memreclaim.asdict(info)
    assert data["notes"] == [] and data["pid"] == holder.pid
    json.dumps(data)


def test_inspect_failure_modes() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # never handed out
    with pytest.raises(ProcessLookupError):
        memreclaim.inspect(pid_max)
    for bad in ("1", 1.0, True, None):
        with pytest.raises(TypeError, match="pid must be an int"):
            memreclaim.inspect(bad)  # type: ignore[arg-type]
    for bad in (0, -5, 1 << 40):
        with pytest.raises(ValueError, match="positive process ID"):
            memreclaim.inspect(bad)


def test_inspect_of_this_process_agrees_with_stats() -> None:
    info = memreclaim.inspect(os.getpid())
    st = memreclaim.stats()
    assert info.threads is not None and info.threads >= 1
    assert info.rss is not None and info.peak_rss is not None and info.peak_rss >= info.rss
    assert abs(info.rss - st.rss) < st.rss / 2  # two readings of one file, moments apart
    assert "inspect" in memreclaim.__all__ and "asdict" in memreclaim.__all__
