"""Give back the memory of empty pymalloc pools inside live arenas (CPython 3.11, opt-in).

pymalloc returns a 1 MiB arena to the OS only when all of its 16 KiB pools are empty, so a few
surviving small objects can pin many megabytes that no ``malloc_trim`` can reach. After
:func:`enable_pool_reclaim`, :func:`reclaim_pools` drops the pages of every empty pool except
the first page of each (which holds pymalloc's bookkeeping).

It depends on CPython's private pymalloc layout and is therefore gated: CPython 3.11 micro
versions on a tested allow-list, 64-bit Linux, 4 KiB pages, pymalloc active, the main
interpreter, our arena-allocator wrapper still installed, and a self-test in a forked child.
When a gate fails, :class:`PoolReclaimUnavailable` says which. See ``docs/pool-reclaim.md``.
"""

from __future__ import annotations

import sys
from typing import NamedTuple, TypedDict, cast

__all__ = [
    "PoolReclaimResult",
    "PoolReclaimStatus",
    "PoolReclaimUnavailable",
    "enable_pool_reclaim",
    "estimate_pool_reclaim",
    "pool_reclaim_status",
    "reclaim_pools",
]


class PoolReclaimStatus(TypedDict):
    """State of pool reclaim in this process (``pool_reclaim_status()``)."""

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
    pools_released: int
    bytes_released: int
    arenas_skipped: int
    """Arenas left untouched because validation failed (0 in a healthy process)."""
    last_reclaim_ns: int
    max_reclaim_ns: int
    total_reclaim_ns: int
    """Time spent scanning with the GIL held, in nanoseconds."""
    self_test_pools_released: int


class PoolReclaimResult(NamedTuple):
    """Outcome of one :func:`reclaim_pools` call."""

    pools_released: int
    """Empty pools whose body pages were given back."""
    bytes_released: int
    """Resident bytes dropped (MADV_DONTNEED)."""
    arenas_scanned: int
    arenas_skipped: int
    """Arenas left untouched because their headers did not validate."""
    complete: bool
    """True when this call reached the end of the arena table (a full pass is done)."""
    elapsed_ns: int
    """Time this call held the GIL scanning, in nanoseconds."""


_IMPORT_ERROR = ""
try:
    from memreclaim import _pools
    from memreclaim._pools import PoolReclaimUnavailable
except ImportError as exc:  # not built on this platform
    _pools = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"memreclaim._pools is not available on {sys.platform}: {exc}"

    class PoolReclaimUnavailable(RuntimeError):  # type: ignore[no-redef]
        """Pool reclaim cannot be used in this process; the message says which gate failed."""


def enable_pool_reclaim() -> None:
    """Check every gate, install the arena-allocator wrapper and run the self-test.

    Call it early in the process (at start-up): only arenas allocated afterwards can be
    reclaimed. Calling it again once enabled does nothing.

    Raises:
        PoolReclaimUnavailable: a gate failed (the message names it).
    """
    if _pools is None:
        raise PoolReclaimUnavailable(_IMPORT_ERROR)
    _pools.enable()


def reclaim_pools(budget_arenas: int | None = None) -> PoolReclaimResult:
    """Give back the pages of empty pymalloc pools; the GIL is held while it runs.

    Args:
        budget_arenas: None to scan every tracked arena; an int N >= 1 to scan at most N
            arenas, continuing where the previous budgeted call stopped (``complete`` tells when
            a pass has reached the end). Roughly 8 µs per arena plus 3 µs per released pool.

    Raises:
        PoolReclaimUnavailable: not enabled, or a gate failed since (e.g. the arena allocator
            was replaced); the feature then stays off.
        TypeError: budget_arenas is neither None nor an int.
        ValueError: budget_arenas < 1.
    """
    if _pools is None:
        raise PoolReclaimUnavailable(_IMPORT_ERROR)
    if budget_arenas is not None and (
        isinstance(budget_arenas, bool) or not isinstance(budget_arenas, int)
    ):
        raise TypeError(f"budget_arenas must be None or an int, not {type(budget_arenas).__name__}")
    return _convert(_pools.reclaim(budget_arenas))


def estimate_pool_reclaim() -> PoolReclaimResult:
    """Say what :func:`reclaim_pools` would give back now, without changing anything.

    ``pools_released`` and ``bytes_released`` count the empty pools whose body pages are
    resident, over every tracked arena; the budget cursor does not move. For diagnosis: how
    much of pymalloc's retention pool reclaim can return. Costs a few µs per arena.

    Raises:
        PoolReclaimUnavailable: not enabled, or a gate failed since.
    """
    if _pools is None:
        raise PoolReclaimUnavailable(_IMPORT_ERROR)
    return _convert(_pools.estimate())


def _convert(result: _pools.ReclaimResult) -> PoolReclaimResult:
    return PoolReclaimResult(
        pools_released=result.pools_released,
        bytes_released=result.bytes_released,
        arenas_scanned=result.arenas_scanned,
        arenas_skipped=result.arenas_skipped,
        complete=result.complete,
        elapsed_ns=result.elapsed_ns,
    )


def pool_reclaim_status() -> PoolReclaimStatus:
    """Return whether pool reclaim is enabled, why not, and its running totals."""
    if _pools is None:
        return PoolReclaimStatus(
            enabled=False,
            available=False,
            reason=_IMPORT_ERROR,
            arenas_tracked=0,
            arenas_recorded=0,
            arenas_forgotten=0,
            foreign_blocks=0,
            table_errors=0,
            reclaim_calls=0,
            pools_released=0,
            bytes_released=0,
            arenas_skipped=0,
            last_reclaim_ns=0,
            max_reclaim_ns=0,
            total_reclaim_ns=0,
            self_test_pools_released=0,
        )
    return cast(PoolReclaimStatus, _pools.status())
