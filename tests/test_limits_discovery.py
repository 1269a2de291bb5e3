"""memreclaim.memlimits' one cgroup discovery: cgroup_dirs and parse_counters on fixture trees, the
same directories for the limits and the pressure watcher's sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from memreclaim import memlimits
from memreclaim.memlimits import CgroupDirs, cgroup_dirs, find_sources, parse_counters

MOUNTINFO = (
    "22 1 0:21 / /proc rw - proc proc rw\n"
    "30 22 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    "35 22 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_both_hierarchies_innermost_first(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "proc/self/cgroup": "4:memory:/app/web\n1:cpu:/\n0::/svc/web\n",
            "proc/self/mountinfo": MOUNTINFO,
            "sys/fs/cgroup/unified/svc/web/memory.events": "high 2\n",
            "sys/fs/cgroup/memory/app/web/memory.limit_in_bytes": "1000\n",
        },
    )
    dirs = cgroup_dirs(str(tmp_path))
    v2 = tmp_path / "sys/fs/cgroup/unified"
    v1 = tmp_path / "sys/fs/cgroup/memory"
    assert dirs.v2 == (str(v2 / "svc/web"), str(v2 / "svc"), str(v2))
    assert dirs.v1 == (str(v1 / "app/web"), str(v1 / "app"), str(v1))
    assert dirs.notes == ()
    # the pressure watcher reads the same directory
    assert find_sources(str(tmp_path))[1] == str(v2 / "svc/web/memory.events")


def test_what_cannot_be_found_is_said(tmp_path: Path) -> None:
    assert cgroup_dirs(str(tmp_path)) == CgroupDirs(notes=("/proc/self/cgroup is not readable",))
    _tree(
        tmp_path,
        {"proc/self/cgroup": "4:memory:/app\n0::/x\n", "proc/self/mountinfo": "22 1 0:21 / /p"},
    )
    dirs = cgroup_dirs(str(tmp_path))
    assert dirs.v1 == () and dirs.v2 == ()
    assert dirs.notes == (
        "a cgroup v1 memory controller is listed but not mounted",
        "no cgroup2 mount in /proc/self/mountinfo",
    )


def test_bad_root() -> None:
    with pytest.raises(TypeError, match="root must be a path"):
        cgroup_dirs(42)  # type: ignore[arg-type]


def test_parse_counters() -> None:
    text = "low 0\nhigh 17\nbroken\nmax x\noom_kill 1\n"
    assert parse_counters(text) == {"low": 0, "high": 17, "oom_kill": 1}
    assert parse_counters(None) == {} and parse_counters("") == {}


def test_parse_counters_is_the_one_parser_of_memory_events() -> None:
    # the limits' events and the memory.events wake-up source read a file the same way; the
    # wake-up keeps only the counters whose growth is a wake-up
    from memreclaim.runners import wakeups

    text = "low 3\nhigh 17\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\nbroken\nmax2 x\n"
    assert wakeups._event_counts(text) == {
        k: v for k, v in parse_counters(text).items() if k in wakeups.EVENT_COUNTERS
    }
    assert wakeups._event_counts(text) == {"high": 17, "max": 2, "oom": 1, "oom_kill": 1}
    assert wakeups._event_counts(None) == {}


@pytest.mark.parametrize("text", [b"high 1\n", 1, ["high 1"]])
def test_parse_counters_bad_text(text: object) -> None:
    with pytest.raises(TypeError, match="text must be a str or None"):
        parse_counters(text)  # type: ignore[arg-type]


def test_the_old_private_path_is_the_same_module_content() -> None:
    from memreclaim import _limits

    for name in ("UNLIMITED", "Limits", "UsageAlarm", "limits", "read_limits", "usage_alarm"):
        assert getattr(_limits, name) is getattr(memlimits, name), name
