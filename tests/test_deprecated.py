"""The one-release shims of names made private or moved (memreclaim._deprecated): each old name
warns DeprecationWarning naming where the value is now, and returns that same value; the new
public paths do not warn; a name that never existed is still an AttributeError."""

from __future__ import annotations

import importlib
import warnings

import pytest

from memreclaim import glibc, memlimits, policy, units, watchdog
from memreclaim.runners import wakeups

OLD_NAMES = [
    ("memreclaim.policy", "AUTO_SLACK_MIN", policy._AUTO_SLACK_MIN),
    ("memreclaim.policy", "AUTO_SLACK_FRACTION", policy._AUTO_SLACK_FRACTION),
    ("memreclaim.policy", "NEAR_LIMIT_TICK", policy._NEAR_LIMIT_TICK),
    ("memreclaim.policy", "NEAR_LIMIT_FREE_READ", policy._NEAR_LIMIT_FREE_READ),
    ("memreclaim.pressure", "PressureSource", wakeups.PressureSource),
    ("memreclaim.pressure", "find_sources", memlimits.find_sources),
    ("memreclaim.watchdog", "THREAD_TRIM_THRESHOLD", watchdog._THREAD_TRIM_THRESHOLD),
    ("memreclaim", "MMAP_THRESHOLD_MAX", glibc.MMAP_THRESHOLD_MAX),
    ("memreclaim", "ArenaInfo", glibc.ArenaInfo),
    ("memreclaim", "arenas", glibc.arenas),
    ("memreclaim", "malloc_info", glibc.malloc_info),
    ("memreclaim", "set_arena_max", glibc.set_arena_max),
    ("memreclaim", "format_bytes", units.format_bytes),
    ("memreclaim", "parse_bytes", units.parse_bytes),
    ("memreclaim", "Limits", memlimits.Limits),
    ("memreclaim.memlimits", "UsageAlarm", wakeups.UsageAlarm),
    ("memreclaim.memlimits", "usage_alarm", wakeups.usage_alarm),
    ("memreclaim._limits", "UsageAlarm", wakeups.UsageAlarm),
]


@pytest.mark.parametrize(("module", "name", "value"), OLD_NAMES)
def test_old_name_warns_and_returns_the_value(module: str, name: str, value: object) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} is deprecated.*use ") as seen:
        got = getattr(mod, name)
    assert got is value
    assert len(seen) == 1 and seen[0].filename == __file__  # points at the caller
    assert name not in mod.__all__


@pytest.mark.parametrize(("module", "name", "value"), OLD_NAMES[:1] + OLD_NAMES[4:6])
def test_from_import_of_an_old_name_warns(module: str, name: str, value: object) -> None:
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=name):
        exec(f"from {module} import {name} as got", namespace)
    assert namespace["got"] is value


@pytest.mark.parametrize("module", ["memreclaim.policy", "memreclaim.pressure"])
def test_unknown_name_is_still_an_attribute_error(module: str) -> None:
    mod = importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        with pytest.raises(AttributeError, match="no attribute 'NOPE'"):
            mod.NOPE  # noqa: B018
        assert not hasattr(mod, "NEAR_LIMIT_NOPE")


def test_public_homes_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from memreclaim.memlimits import find_sources
        from memreclaim.policy import NEAR_LIMIT_HOLD, Decision, Provisional
        from memreclaim.runners.wakeups import PressureSource

    assert isinstance(NEAR_LIMIT_HOLD, float) and Decision is not None and Provisional is not None
    assert PressureSource("psi", "/x", "poll").mode == "poll" and callable(find_sources)
