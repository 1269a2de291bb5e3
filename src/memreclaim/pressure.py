"""Act when the kernel reports memory pressure, by its first import path (kept): the
:class:`PressureWatcher` lives in :mod:`memreclaim.runners.pressure`; this module re-exports it.

    >>> from memreclaim.pressure import PressureWatcher
    >>> watcher = PressureWatcher()  # memreclaim.trim() on pressure, at most every 10 s
    >>> watcher.start()
    >>> watcher.sources              # what it watches and how: "trigger" or "poll"
    >>> watcher.stop()
"""

from __future__ import annotations

from .runners.pressure import PressureEvent, PressureSource, PressureWatcher, find_sources

__all__ = ["PressureEvent", "PressureSource", "PressureWatcher", "find_sources"]
