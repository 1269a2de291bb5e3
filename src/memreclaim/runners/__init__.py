"""The runners: they read the world, ask the pure :class:`~memreclaim.policy.PacingPolicy`, trim
and report.

- :mod:`._base`: what every runner shares (signals, one trim under the process lock, counters,
  fork handling); the runners' threads are :class:`memreclaim._daemon.DaemonThread`'s, the one
  daemon-thread lifecycle.
- :mod:`.aio`: :class:`Watchdog`, for asyncio programs.
- :mod:`.thread`: :class:`BackgroundTrimmer`, a daemon thread plus hooks for request ends.
- :mod:`.pressure`: :class:`PressureWatcher`, acting on the kernel's pressure reports.

Names are loaded on first use, so importing one runner does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import Counters, TrimEvent
    from .aio import Watchdog
    from .pressure import PressureEvent, PressureWatcher
    from .thread import BackgroundTrimmer

__all__ = [
    "BackgroundTrimmer",
    "Counters",
    "PressureEvent",
    "PressureWatcher",
    "TrimEvent",
    "Watchdog",
]

_WHERE = {
    "BackgroundTrimmer": "thread",
    "Counters": "_base",
    "PressureEvent": "pressure",
    "PressureWatcher": "pressure",
    "TrimEvent": "_base",
    "Watchdog": "aio",
}


def __getattr__(name: str) -> Any:
    """Load a runner's name from its module on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
