"""docs/architecture.md rule 4, "one wake-up multiplexer": memreclaim.runners.wakeups is the one
Python module that uses epoll, eventfd, inotify or poll/select (the cgroup v1 usage alarm, the
PSI trigger, memory.events, systemd's protocol and the pressure watcher all sleep through it).
The test reads every module's code (names, attributes and imports; docstrings and messages aside)
and fails when another module uses one of them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "memreclaim"
OWNER = "runners/wakeups.py"
# select.epoll / EPOLL*, select.poll / POLL*, select.select, os.eventfd*, any inotify binding.
SELECT = ("epoll", "poll", "select", "devpoll", "kqueue")


def _uses(source: str) -> set[str]:
    """What of epoll/eventfd/inotify/poll/select ``source``'s code uses (as ``module.name``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, name = node.value.id, node.attr
            if owner == "select" and (name in SELECT or name.startswith(("EPOLL", "POLL"))):
                found.add(f"select.{name}")
            elif owner == "os" and (name.startswith(("eventfd", "EFD_")) or "inotify" in name):
                found.add(f"os.{name}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("select", "os"):
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            found.update(name for name in names if "inotify" in name)
        elif isinstance(node, ast.Name) and "inotify" in node.id.lower():
            found.add(node.id)
    return found


def test_the_detector_sees_each_kind_and_skips_docstrings() -> None:
    code = (
        '"""Uses select.epoll and os.eventfd."""\n'
        "import select, os\n"
        "e = select.epoll()\n"
        "m = select.EPOLLIN | select.POLLPRI\n"
        "p = select.poll()\n"
        "r = select.select([], [], [], 0)\n"
        "f = os.eventfd(0, os.EFD_CLOEXEC)\n"
        "os.eventfd_write(f, 1)\n"
        "import inotify_simple\n"
        'log("epoll failed")\n'
    )
    assert _uses(code) == {
        "select.epoll",
        "select.EPOLLIN",
        "select.POLLPRI",
        "select.poll",
        "select.select",
        "os.eventfd",
        "os.EFD_CLOEXEC",
        "os.eventfd_write",
        "inotify_simple",
    }
    assert _uses("from select import epoll\n") == {"select.epoll"}
    assert _uses('"""select.epoll"""\nmessage = "os.eventfd"\n') == set()


def test_one_module_owns_the_wake_up_calls() -> None:
    users = {
        path.relative_to(PACKAGE).as_posix(): sorted(_uses(path.read_text()))
        for path in sorted(PACKAGE.rglob("*.py"))
        if _uses(path.read_text())
    }
    assert set(users) == {OWNER}, f"only {OWNER} may use epoll/eventfd/inotify/poll: {users}"
    assert {"select.epoll", "os.eventfd"} <= set(users[OWNER])


def test_the_moved_wake_up_names_keep_their_old_paths_for_one_release() -> None:
    from memreclaim.runners import wakeups

    for module in ("memreclaim.memlimits", "memreclaim._limits"):
        with pytest.warns(DeprecationWarning, match="memreclaim.runners.wakeups.UsageAlarm"):
            assert importlib.import_module(module).UsageAlarm is wakeups.UsageAlarm
    # runners.pressure did not exist in 0.2.0: no deprecation table for its never-released names.
    pressure = importlib.import_module("memreclaim.runners.pressure")
    assert not hasattr(pressure, "_MOVED") and not hasattr(pressure, "find_sources")
