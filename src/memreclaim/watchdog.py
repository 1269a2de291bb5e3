"""Background reclaim runners, by their first import path (kept): the asyncio :class:`Watchdog`
and the thread :class:`BackgroundTrimmer` with its hook calls. They live in
:mod:`memreclaim.runners` (:mod:`~memreclaim.runners.aio`, :mod:`~memreclaim.runners.thread`,
the shared :mod:`~memreclaim.runners._base`); this module re-exports them.
"""

from __future__ import annotations

from ._daemon import _at_exit as _at_exit
from .glibc import THREAD_TRIM_THRESHOLD as THREAD_TRIM_THRESHOLD
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
