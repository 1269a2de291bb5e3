"""What the policy is given: one reading per tick (:class:`Reading`) and one trim's outcome
(:class:`TrimOutcome`), both frozen and checked when made, so a bad figure raises before any
rule sees it and changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .. import _validate

__all__ = ["Decision", "Provisional", "Reading", "TrimOutcome"]

Decision = Literal["below-slack", "rising", "min-interval", "backoff", "budget", "trim"]
"""What :meth:`PacingPolicy.decide` answers."""

Provisional = Literal["incomplete", "regrowth"]
"""Why the learned level is provisional (see :attr:`PacingPolicy.provisional`)."""


def _check_figures(record: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(record, name)
        if value is not None:
            _validate.integer(name, value)


@dataclass(frozen=True)
class Reading:
    """One runner tick's signals, as :meth:`PacingPolicy.decide` takes them.

    Raises:
        TypeError, ValueError: a figure that is not a whole number >= 0 (or None), naming it.
    """

    now: float
    """Monotonic seconds."""
    rss: int
    """Resident bytes now."""
    traced: int | None = None
    """tracemalloc's traced bytes, or None when not tracing."""
    free: int | None = None
    """The allocator's free bytes (:attr:`HeapStats.free`) when the caller read them (see
    :meth:`PacingPolicy.wants_free`), else None."""
    in_flight: int | None = None
    """Requests being handled now, when the caller knows; None otherwise."""
    settled: bool = False
    """The unit of work that allocated is over (a hook after a request or task in a process
    that handles one at a time): skip the rising check."""
    in_use: int | None = None
    """The allocator's in-use bytes (:attr:`HeapStats.in_use`, plus what library pools report
    in use), read with ``free``; a drop below their value after the last trim sizes what it
    unpinned."""
    vsize: int | None = None
    """The mapped address space in bytes, read with ``in_use``, where memory can come back
    without allocation (THP ``enabled=always``: the runners pass it only then); growth that
    neither it nor ``in_use`` explains is regrowth, not a trigger. None: no regrowth rule."""
    mapped: int | None = None
    """The bytes the allocators map plus what library pools report in use, read with
    ``in_use``: resident memory none of them accounts for, grown by more than half of
    ``slack`` since the last trim to more than ``slack``, is a trigger (not with ``vsize``)."""

    def __post_init__(self) -> None:
        _check_figures(self, ("traced", "free", "in_flight", "in_use", "vsize", "mapped"))
        _validate.flag("settled", self.settled)


@dataclass(frozen=True)
class TrimOutcome:
    """What a trim made at ``now`` (its end) did, as :meth:`PacingPolicy.record_trim` takes it.

    The allocator's figures right after the trim, when known, let the policy see what the trim
    missed: ``in_use``, ``mapped`` (as in :class:`Reading`), ``vsize`` and ``unreached`` (the
    trim could not act on or read a part: a ``None`` in :attr:`TrimResult.parts`, or a
    :attr:`TrimResult.reason`).

    Raises:
        TypeError, ValueError: a bad figure, ``seconds`` < 0 or a non-bool ``unreached``.
    """

    now: float
    """Monotonic seconds at the end of the trim."""
    growth: int
    """Growth over the learned level when the trim fired (:meth:`PacingPolicy.growth`)."""
    released: int
    """Bytes the trim gave back."""
    rss_after: int
    """RSS right after the trim: the learned level from now on."""
    seconds: float = 0.0
    """Seconds the trim took, charged to the CPU budget."""
    traced: int | None = None
    """tracemalloc's traced bytes after the trim, or None."""
    free: int | None = None
    """The allocator's free bytes after the trim: the mark later frees are measured from."""
    in_use: int | None = None
    """The allocator's in-use bytes after the trim (with library pools'), or None."""
    mapped: int | None = None
    """The bytes the allocators map after the trim (with library pools' in use), or None."""
    vsize: int | None = None
    """The mapped address space after the trim (THP ``always`` only), or None."""
    unreached: bool = False
    """The trim could not act on or read a part of the process's memory."""
    in_use_before: int | None = None
    """The in-use bytes (as ``in_use``) when the trim started: the reading that decided it, or
    read just before it. More than ``in_use``: memory freed while it ran (by another thread),
    which it may have passed; the drop still counts as one after it. None: not known."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "seconds", _validate.seconds("seconds", self.seconds, allow_zero=True)
        )
        _check_figures(self, ("in_use", "mapped", "vsize", "in_use_before"))
        _validate.flag("unreached", self.unreached)
