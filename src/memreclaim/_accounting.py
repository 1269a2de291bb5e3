"""Process-wide trim accounting, a shim over the C core's totals (kept for its importers).

Every trim is counted by the C core's ``trim`` itself (the public :func:`memreclaim.trim`, the
runners and any direct ``memreclaim._core.trim`` call alike), once, so metrics agree with the
runners' counters, never count one release twice, and no call can bypass them. The public face is
:func:`memreclaim.totals`, which returns the C core's :class:`memreclaim.TrimTotals`; so does
:func:`totals` here (its hand-made twin of that record is gone); ``UNPRODUCTIVE_BELOW`` and
``SECONDS_BUCKETS`` are the C core's.
"""

from __future__ import annotations

from . import _core

__all__ = ["SECONDS_BUCKETS", "UNPRODUCTIVE_BELOW", "record", "totals"]

UNPRODUCTIVE_BELOW: int = _core.UNPRODUCTIVE_BELOW
"""A trim that gives back less than this many bytes (or an unknown amount) is unproductive."""

SECONDS_BUCKETS: tuple[float, ...] = _core.SECONDS_BUCKETS
"""Upper bounds (seconds) of the trim-duration histogram; a last bucket holds the rest."""


def record(released: int | None, seconds: float) -> None:
    """Count a trim made outside the C core's ``trim`` that gave back ``released`` bytes (None:
    unknown) in ``seconds``; ``trim`` counts itself.

    Raises:
        TypeError: ``released`` is not an int or None, or ``seconds`` not a number.
        ValueError: ``released`` is negative, or ``seconds`` negative or not finite.
    """
    _core._record_trim(released, seconds)


def totals() -> _core.TrimTotals:
    """A consistent copy of the process totals: :func:`memreclaim.totals`."""
    return _core.totals()
