"""The memory limit's first import path (kept): everything lives in :mod:`memreclaim.memlimits`,
the package's one cgroup discovery; this module re-exports it."""

from __future__ import annotations

from .memlimits import DEFAULT_FRACTION as DEFAULT_FRACTION
from .memlimits import UNLIMITED, Limits, UsageAlarm, limits, read_limits
from .memlimits import usage_alarm as usage_alarm

__all__ = ["UNLIMITED", "Limits", "UsageAlarm", "limits", "read_limits"]
