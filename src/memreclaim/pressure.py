"""Act when the kernel reports memory pressure, by its first import path (kept): the
:class:`PressureWatcher` lives in :mod:`memreclaim.runners.pressure`; this module re-exports it.

    >>> from memreclaim.pressure import PressureWatcher
    >>> watcher = PressureWatcher()  # memreclaim.trim() on pressure, at most every 10 s
    >>> watcher.start()
    >>> watcher.sources              # what it watches and how: "trigger" or "poll"
    >>> watcher.stop()
"""

from __future__ import annotations

from . import _deprecated, memlimits
from .runners import wakeups
from .runners.pressure import PressureEvent, PressureWatcher

__all__ = ["PressureEvent", "PressureWatcher"]

# Moved (one release, then gone): to memreclaim.runners.wakeups, and the cgroup discovery's
# find_sources to memreclaim.memlimits.
_MOVED: dict[str, tuple[str, object]] = {
    "PressureSource": ("memreclaim.runners.wakeups.PressureSource", wakeups.PressureSource),
    "find_sources": ("memreclaim.memlimits.find_sources", memlimits.find_sources),
}


def __getattr__(name: str) -> object:
    return _deprecated.lookup(__name__, name, _MOVED)
