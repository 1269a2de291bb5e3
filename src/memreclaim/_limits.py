"""The memory limit's first import path (kept): everything lives in :mod:`memreclaim.memlimits`,
the package's one cgroup discovery; this module re-exports it. ``UsageAlarm`` and
``usage_alarm`` moved to :mod:`memreclaim.runners.wakeups` (one release, then gone)."""

from __future__ import annotations

from .memlimits import DEFAULT_FRACTION as DEFAULT_FRACTION
from .memlimits import UNLIMITED, Limits, limits, read_limits

__all__ = ["UNLIMITED", "Limits", "limits", "read_limits"]


def __getattr__(name: str) -> object:
    import importlib

    from . import _deprecated

    if name not in ("UsageAlarm", "usage_alarm"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = "memreclaim.runners.wakeups"
    value = getattr(importlib.import_module(home), name)
    return _deprecated.lookup(__name__, name, {name: (f"{home}.{name}", value)})
