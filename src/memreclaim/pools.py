"""Give back the memory of empty pymalloc pools inside live arenas (CPython 3.11-3.15, opt-in).

pymalloc returns a 1 MiB arena to the OS only when all of its 16 KiB pools are empty, so a few
surviving small objects can pin many megabytes that no ``malloc_trim`` can reach. After
:func:`enable_pool_reclaim`, ``memreclaim.trim(pools=True)`` drops the pages of every empty pool
except the first page of each (which holds pymalloc's bookkeeping), and the pages of pools in
use on which no live block lies; its ``TrimResult`` reports ``pools_released`` (empty pools) and
``pools_bytes`` (all bytes). That is the one way to reclaim pools.

It depends on CPython's private pymalloc layout and is therefore gated: CPython 3.11 to 3.15 in
their default (GIL) builds, 64-bit Linux, 4 KiB pages, pymalloc active, the main interpreter (and
from 3.12 no other interpreter alive), our arena-allocator wrapper still installed, and a
self-test in a forked child. When a gate fails, :class:`PoolReclaimUnavailable` says which.
See ``docs/pool-reclaim.md``.
"""

from __future__ import annotations

from typing import TypedDict, cast

__all__ = [
    "PoolReclaimStatus",
    "PoolReclaimUnavailable",
    "enable_pool_reclaim",
    "estimate_pool_reclaim",
    "pool_reclaim_status",
]


class PoolReclaimStatus(TypedDict):
    """State of pool reclaim in this process (``pool_reclaim_status()``).

    The one definition of the status keys: ``memreclaim._pools.status()`` returns exactly these.
    """

    enabled: bool
    """True once every gate and the self-test passed."""
    available: bool
    """False when a gate rules it out for good in this process."""
    reason: str | None
    """Why it is not enabled; None when enabled."""
    arenas_tracked: int
    """pymalloc arenas currently known (allocated since enabling, not yet freed)."""
    arenas_recorded: int
    arenas_forgotten: int
    foreign_blocks: int
    """Blocks through the arena allocator that are not pymalloc arenas (never touched)."""
    table_errors: int
    reclaim_calls: int
    """Passes run by ``trim(pools=True)``."""
    pools_released: int
    """Empty pools whose pages after the first were given back."""
    bytes_released: int
    """All bytes given back: empty pools' and ``used_bytes_released``."""
    used_pools_trimmed: int
    """Times a pool holding live blocks gave back pages that hold none of them."""
    used_bytes_released: int
    arenas_skipped: int
    """Arenas left untouched because validation failed (0 in a healthy process)."""
    last_reclaim_ns: int
    total_reclaim_ns: int
    """Duration of the last pass and of all passes, GIL releases included, in nanoseconds."""
    max_hold_ns: int
    """Longest single GIL hold of any pass slice, wall clock (preemption included), in ns."""
    max_hold_cpu_ns: int
    """The same slice measured in the thread's CPU time: the work, without preemption."""
    self_test_pools_released: int


_IMPORT_ERROR = ""
try:
    from memreclaim import _pools
    from memreclaim._pools import PoolReclaimUnavailable
except ImportError as exc:  # not built for this platform or interpreter
    _pools = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"memreclaim._pools is not available on this interpreter: {exc}"

    class PoolReclaimUnavailable(RuntimeError):  # type: ignore[no-redef]
        """Pool reclaim cannot be used in this process; the message says which gate failed."""


def enable_pool_reclaim() -> None:
    """Check every gate, install the arena-allocator wrapper and run the self-test.

    Call it early in the process (at start-up): only arenas allocated afterwards can be
    reclaimed. Calling it again once enabled does nothing. Afterwards
    ``memreclaim.trim(pools=True)`` gives back the pages of empty pools.

    Raises:
        PoolReclaimUnavailable: a gate failed (the message names it).
    """
    if _pools is None:
        raise PoolReclaimUnavailable(_IMPORT_ERROR)
    _pools.enable()


def estimate_pool_reclaim() -> int:
    """Bytes ``trim(pools=True)`` would give back from empty pools now, changing nothing.

    Counts the resident body pages of empty pools in every tracked arena, in slices like a
    reclaim (the GIL is released between them). For diagnosis: how much of pymalloc's
    retention pool reclaim can return.

    Raises:
        PoolReclaimUnavailable: not enabled, or a gate failed since.
    """
    if _pools is None:
        raise PoolReclaimUnavailable(_IMPORT_ERROR)
    return _pools.estimate()


def pool_reclaim_status() -> PoolReclaimStatus:
    """Return whether pool reclaim is enabled, why not, and its running totals."""
    if _pools is None:
        status = dict.fromkeys(PoolReclaimStatus.__annotations__, 0)
        status.update(enabled=False, available=False, reason=_IMPORT_ERROR)
        return cast(PoolReclaimStatus, status)
    return cast(PoolReclaimStatus, _pools.status())
