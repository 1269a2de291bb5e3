"""Background reclaim runners, by their first import path (kept): the asyncio :class:`Watchdog`
and the thread :class:`BackgroundTrimmer` with its hook calls. They live in
:mod:`memreclaim.runners` (:mod:`~memreclaim.runners.aio`, :mod:`~memreclaim.runners.thread`,
the shared :mod:`~memreclaim.runners._base`); this module re-exports them.
"""

from __future__ import annotations

from . import _deprecated
from ._daemon import _at_exit as _at_exit
from .policy import Decision, PacingPolicy
from .runners._base import MAX_INTERVAL as MAX_INTERVAL
from .runners._base import Counters, TrimEvent
from .runners._base import Gate as Gate
from .runners.aio import Watchdog
from .runners.thread import BackgroundTrimmer

__all__ = [
    "BackgroundTrimmer",
    "Counters",
    "Decision",
    "PacingPolicy",
    "TrimEvent",
    "Watchdog",
]

_THREAD_TRIM_THRESHOLD = 128 * 1024
"""The trim threshold the runners set in 0.2.0 (bytes), for the shim below."""

# In 0.2.0 (importable, not in __all__); one release, then gone.
_PRIVATE: dict[str, tuple[str, object]] = {
    "THREAD_TRIM_THRESHOLD": (
        "memreclaim.glibc.bound_thread_tops() (the runners' knob now, THREAD_TOP_BOUND)",
        _THREAD_TRIM_THRESHOLD,
    ),
}


def __getattr__(name: str) -> object:
    return _deprecated.lookup(__name__, name, _PRIVATE)
