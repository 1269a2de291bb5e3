"""Every glibc heuristic of the package: ``malloc_info()`` parsed per arena, the arena-limit knob
with its check, and the thread-arena fix the runners apply in threaded servers.

glibc's ``malloc_trim`` does not shrink the tops of non-main thread arenas. Bounding the tops
(:func:`bound_thread_tops`: the mmap threshold pinned at its maximum, the trim threshold at
:data:`THREAD_TOP_BOUND`) makes every free at a top give back what it keeps above the bound, with
no cost on loops of blocks under it; the runners (:mod:`memreclaim.runners`) do it at start
unless the environment sets the thresholds (``_environment_thresholds``). A free of a chunk of
64 KiB or more in an arena (:func:`nudge_arena`, made in the thread that owns it) gives back a
top kept from before. The runners' fix for what other threads keep, once per process, is here
too (``_fix_thread_retention``), with its mimalloc 2 counterpart: the purge delay to 0.

Private, for the package and its tests only (made after 0.2.0, never released): the runners'
environment check ``_environment_thresholds`` and ``_NUDGE_BYTES``, the size :func:`nudge_arena`
frees.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from . import _core
from ._core import MMAP_THRESHOLD_MAX, UnsupportedAllocatorError, malloc_info
from .units import format_bytes

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

_T = TypeVar("_T")
logger = logging.getLogger("memreclaim")

__all__ = [
    "MMAP_THRESHOLD_MAX",
    "THREAD_TOP_BOUND",
    "ArenaInfo",
    "arenas",
    "bound_thread_tops",
    "malloc_info",
    "nudge_arena",
    "set_arena_max",
]

THREAD_TOP_BOUND = 4 * 1024 * 1024
"""The trim threshold :func:`bound_thread_tops` sets (bytes): what a free leaves at most at the
top of any arena, the main one and every thread's."""

_NUDGE_BYTES = 96 * 1024
"""The chunk :func:`nudge_arena` frees: >= glibc's FASTBIN_CONSOLIDATION_THRESHOLD (64 KiB), the
size of a free that makes glibc trim its arena's top, and under any mmap threshold (>= 128 KiB)."""


@dataclass(frozen=True)
class ArenaInfo:
    """One glibc arena from ``malloc_info()``; sizes in bytes.

    Attributes:
        nr: glibc's arena number (0 is the main arena, on the brk heap).
        free_bytes: bytes in free chunks (fastbins and the rest), resident or not.
        free_chunks: number of free chunks.
        fast_bytes: bytes in fastbin chunks.
        mapped: bytes this arena has from the kernel now (``system current``).
        peak_mapped: the most it ever had (``system max``).
    """

    nr: int
    free_bytes: int
    free_chunks: int
    fast_bytes: int
    mapped: int
    peak_mapped: int


def _total(heap: ET.Element, tag: str, type_: str, attr: str) -> int:
    for node in heap.findall(tag):
        if node.get("type") == type_:
            return int(node.get(attr, "0"))
    return 0


def arenas() -> list[ArenaInfo]:
    """Parse ``malloc_info()`` into one :class:`ArenaInfo` per glibc arena.

    Raises:
        UnsupportedAllocatorError: when glibc does not serve malloc.
    """
    import xml.etree.ElementTree as ET  # costs ~1 MiB of RSS: loaded when first asked

    root = ET.fromstring(_core.malloc_info())
    result = []
    for heap in root.findall("heap"):
        fast_bytes = _total(heap, "total", "fast", "size")
        rest_bytes = _total(heap, "total", "rest", "size")
        result.append(
            ArenaInfo(
                nr=int(heap.get("nr", "0")),
                free_bytes=fast_bytes + rest_bytes,
                free_chunks=_total(heap, "total", "fast", "count")
                + _total(heap, "total", "rest", "count"),
                fast_bytes=fast_bytes,
                mapped=_total(heap, "system", "current", "size"),
                peak_mapped=_total(heap, "system", "max", "size"),
            )
        )
    return result


def set_arena_max(n: int) -> None:
    """Limit glibc to ``n`` malloc arenas (``mallopt(M_ARENA_MAX, n)``).

    glibc fixes its arena limit the first time a thread needs a new arena after eight exist (or
    after a limit was set), and it never frees arenas. So the call is only sure to work at
    start-up, before threads allocate. When more than one arena already exists this emits a
    :class:`RuntimeWarning` saying the new limit may be ignored and the existing arenas stay.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is outside 1..2147483647.
        OverflowError: ``n`` does not fit in 64 bits.
        UnsupportedAllocatorError: glibc does not serve malloc.
    """
    _core.set_arena_max(n)  # validates its argument before it changes anything
    # Counted after the change (which creates and frees no arena), so that bad input costs no
    # parse of malloc_info()'s XML.
    try:
        existing = len(arenas())
    except UnsupportedAllocatorError:
        existing = 0  # glibc without malloc_info (hidden, or a wrapper): cannot be checked
    if existing > 1:
        warnings.warn(
            f"set_arena_max({n}) is late: glibc already has {existing} arenas, keeps them, and"
            " ignores a new limit once it has fixed one; call it at start-up, before threads"
            " allocate (or set MALLOC_ARENA_MAX in the environment)",
            RuntimeWarning,
            stacklevel=2,
        )


def bound_thread_tops() -> tuple[int, int]:
    """Bound every arena's free top with no cost cliff; return (mmap threshold, trim threshold).

    Pins the mmap threshold at its maximum (``MMAP_THRESHOLD_MAX``, 32 MiB on 64-bit: the
    ceiling glibc's adaptive threshold reaches anyway, so blocks under it are served from the
    arenas, as they are once a program has freed one such block) and fixes the trim threshold at
    :data:`THREAD_TOP_BOUND`. A free that leaves more than that at the top of an arena, the main
    one or a thread's, gives the rest back (``malloc_trim`` never shrinks a thread arena's top:
    this does, as the thread frees). A loop of blocks under the bound costs nothing more; only
    blocks between the bound and 32 MiB give pages back at each free
    (``benchmarks/bench_knob_cost.py``). It stops glibc's adaptive thresholds, and it does not
    undo a top kept already (:func:`nudge_arena`).

    Raises:
        UnsupportedAllocatorError: glibc does not serve malloc.
    """
    if _core.allocator() != "glibc":
        raise UnsupportedAllocatorError(
            f"the mmap and trim thresholds are glibc's; malloc is served by {_core.allocator()}"
        )
    _core.pin_mmap_threshold(_core.MMAP_THRESHOLD_MAX)
    _core.set_trim_threshold(THREAD_TOP_BOUND)
    return _core.MMAP_THRESHOLD_MAX, THREAD_TOP_BOUND


_ENVIRONMENT_THRESHOLDS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold", "glibc.malloc.top_pad")


def _environment_thresholds() -> str | None:
    """The environment's setting of glibc's trim, mmap or top-pad threshold, or None.

    ``"NAME=value"`` for the first of ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_`` and
    ``MALLOC_TOP_PAD_`` that is set, else the first such tunable in ``GLIBC_TUNABLES``. The
    runners leave glibc's thresholds alone when one is set (the user chose them).
    """
    for name in _ENVIRONMENT_THRESHOLDS:
        value = os.environ.get(name)
        if value is not None:
            return f"{name}={value}"
    for item in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        if item.partition("=")[0] in _TUNABLES:
            return f"GLIBC_TUNABLES={item}"
    return None


def nudge_arena() -> None:
    """Allocate and free one :data:`_NUDGE_BYTES` chunk in the calling thread's arena.

    Once the trim threshold is fixed (:func:`bound_thread_tops`, which the runners call at
    start), that free gives back what this thread's arena keeps at its top above the threshold.
    Call it from the thread that owns the arena (a hook at the end of a request). Harmless, and
    useless, under other allocators.
    """
    block = bytearray(_NUDGE_BYTES)
    del block


# ---- what other threads keep: the runners' fix, once per process ---------------------------

_thread_fix = False
"""Whether the fix below was made (or refused, or left to the environment) in this process."""


def _thread_fix_made() -> bool:
    """The thread-retention fix was tried in this process (its knobs stay set in a fork)."""
    return _thread_fix


def _mimalloc_2() -> bool:
    """mimalloc 2.x serves malloc: memory a live thread freed stays queued in that thread."""
    version = _core.allocator_version() if _core.allocator() == "mimalloc" else None
    return version is not None and version.startswith("2.")


def _set_knob(apply: Callable[[], _T], what: str, reason: str) -> _T | None:
    """``apply()``, or None when the allocator refuses (e.g. a sanitizer that interposes malloc
    leaves glibc without mallopt): the runner runs on with the allocator as it is; said once."""
    try:
        return apply()
    except (UnsupportedAllocatorError, OSError, ValueError) as exc:
        logger.info("memreclaim: could not %s (%s): %s", what, reason, exc)
        return None


def _fix_thread_retention(reason: str) -> bool:
    """Make frees in other threads give their memory back, once per process; log it once.

    glibc: bound every arena's top (:func:`bound_thread_tops`: ``malloc_trim`` cannot shrink
    the tops of thread arenas; a free at a top does, above the trim threshold), unless the
    environment sets glibc's thresholds. mimalloc 2: the purge delay to 0 (a live thread's
    freed pages wait for that thread's next visit to its segment; measured: a worker's 400 MiB
    spike stays resident after any trim, 177 MiB as with ``MIMALLOC_RESET_DELAY=0``).
    True when a knob was set now.
    """
    global _thread_fix
    if _thread_fix:
        return False
    if _core.allocator() == "glibc":
        _thread_fix = True
        return _bound_tops_unless_set(reason)
    if _mimalloc_2():
        _thread_fix = True
        previous = _set_knob(lambda: _core.set_purge_delay(0), "set mimalloc's purge delay", reason)
        if previous is None:
            return False
        logger.info(
            "memreclaim: set mimalloc's purge delay to 0 ms, was %d (%s): mimalloc 2 keeps what"
            " a live thread freed until that thread returns to it; pages freed from now on go"
            " back as they become free",
            previous,
            reason,
        )
        return True
    return False


def _fix_at_start(thresholds: bool | None) -> bool:
    """A runner's start with ``thresholds`` (None, the default, or True; False never calls).

    One meaning of None under every allocator: the fix for thread retention as early as its
    measured cost allows. glibc's bound costs nothing measurable on loops of blocks under 4 MiB
    (docs/threads.md) and acts only at a later free, so it is made at start; mimalloc 2's purge
    delay of 0 costs 14-18x on allocation loops, so it waits until a trim leaves more than the
    slack with three or more threads (the runner's ``_check_arenas``); other allocators need
    none. True: the fix at start, whatever it costs. True when a knob was set now.
    """
    if thresholds:
        return _fix_thread_retention("thresholds=True")
    if _core.allocator() == "glibc":
        return _fix_thread_retention("at start: thresholds=None under glibc")
    return False


def _bound_tops_unless_set(reason: str) -> bool:
    """:func:`bound_thread_tops`, logged, unless the environment sets glibc's thresholds."""
    setting = _environment_thresholds()
    if setting is not None:
        logger.info(
            "memreclaim: left glibc's thresholds as the environment sets them (%s; %s):"
            " the tops of thread arenas keep what those settings let them keep",
            setting,
            reason,
        )
        return False
    bound = _set_knob(bound_thread_tops, "bound glibc's arena tops", reason)
    if bound is None:
        return False
    mmap_threshold, trim_threshold = bound
    logger.info(
        "memreclaim: pinned glibc's mmap threshold at %s and its trim threshold at %s"
        " (%s): malloc_trim cannot shrink the tops of thread arenas; a free at any arena's"
        " top now gives back what it keeps above %s (a top kept already goes back with"
        " the next such free in that arena)",
        format_bytes(mmap_threshold),
        format_bytes(trim_threshold),
        reason,
        format_bytes(trim_threshold),
    )
    return True


def _give_back_thread_share() -> None:
    """In the thread that freed (a hook), once the fix is made: glibc's :func:`nudge_arena`, or
    under mimalloc 2 this thread's collect (only the thread that freed can give back)."""
    if _core.allocator() == "glibc":
        nudge_arena()
    else:  # mimalloc 2: this thread's share (its queued pages), handed over
        _core.collect_thread(abandon=True)
