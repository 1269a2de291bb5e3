"""mimalloc's figures for the diagnosis.

2.x: the in-use bytes of the calling thread's heap, summed page by page with
``mi_heap_visit_blocks`` and split into small (blocks up to 64 KiB) and large blocks, so that
small frees do not net a large leak, after a forced ``mi_collect``: from the main thread it takes
the heaps of exited threads (abandoned) into this thread's heap, so the walk counts their live
blocks too; what other threads' heaps hold beyond that is judged from the resident bytes of
mimalloc's mappings (mimalloc's process-wide committed bytes, ``mi_process_info``, move by tens
of MiB with its segment cache: no measure of a few MiB). 3.x: the visit no longer sees full
pages (they leave the heap's queues), so the in-use bytes cannot be read, and its committed bytes
run ahead of use; the resident bytes of its mappings (all threads, from /proc/self/smaps) stand
in for them: a footprint, confirmed after the trim (``mi_collect``).
"""

from __future__ import annotations

from .. import _core
from .._core import MimallocAreas, UnsupportedAllocatorError, allocator_version, mimalloc_areas

Maps = tuple[tuple[int, int, int], ...]
Raw = tuple[Maps, int, tuple[int, int] | None]

SMALL = 64 * 1024  # blocks up to this size count as small
_MAX_AREAS = 1_000_000  # pages of 64 KiB and more: a 64 GiB heap
_PROBES = (64, 16 * 1024, 1 << 20)  # block sizes malloc'd to learn where mimalloc maps memory


class Mimalloc:
    """mimalloc's figures (see the module docstring)."""

    def __init__(self) -> None:
        version = allocator_version() or "0"
        head = version.split(".")[0]
        self.major = int(head) if head.isdigit() else 0
        # The page walk runs in C (_core.mimalloc_areas): a Python callback allocates (and may
        # free) while mimalloc follows its page queues; such a walk was once seen never ending.
        # 3.6 no longer exports mi_heap_get_backing: the walk is optional from 3.x on.
        self._walkable = True
        try:
            self._walk()
        except UnsupportedAllocatorError:
            if not self.footprint:
                raise AttributeError(
                    "mi_heap_get_backing/mi_heap_visit_blocks are not exported"
                ) from None
            self._walkable = False
        self._probes: set[int] = set()  # addresses known to lie in mimalloc's mappings
        self.last: Raw = ((), 0, None)

    @property
    def footprint(self) -> bool:
        """Whether the figure is resident bytes (3.x) rather than bytes in use."""
        return self.major >= 3

    def _maps(self) -> Maps:
        """(start, end, resident bytes) of each anonymous mapping, after probing: a few blocks
        are malloc'd and freed, and this thread's pages visited, to learn which mappings hold
        mimalloc's memory (:meth:`resident` decides with every address learnt so far, so a
        mapping found late also counts at the points read before)."""
        for size in _PROBES:
            block = _core.diag_probe_address(size)
            if block:
                self._probes.add(block)
        if self._walkable and len(self._probes) < 4096:
            self._probes.update(self._walk().addresses)
        return _core.diag_anon_mappings()

    def resident(self, maps: Maps) -> int:
        """Resident bytes of mimalloc's mappings among ``maps``: those that hold a known
        address, and the anonymous mappings contiguous with them (one reservation, split by
        its commits)."""
        total = 0
        run: list[tuple[int, int, int]] = []

        def close() -> int:
            hit = any(low <= a < high for low, high, _ in run for a in self._probes)
            return sum(rss for _, _, rss in run) if hit else 0

        for entry in sorted(maps):
            if run and run[-1][1] != entry[0]:
                total += close()
                run = []
            run.append(entry)
        return total + (close() if run else 0)

    def _walk(self) -> MimallocAreas:
        """This thread's heap, page by page; OSError (EOVERFLOW) past ``_MAX_AREAS`` pages."""
        return mimalloc_areas(SMALL, _MAX_AREAS)

    def read(self) -> tuple[dict[str, int], int]:
        """(in-use bytes per part, owned bytes); :attr:`last` keeps what :meth:`parts` needs to
        recompute them once every mapping is known."""
        # Freed pages are purged now, not after a delay; 2.x: exited threads' heaps are taken
        # into this one (from the main thread), so the walk sees their blocks.
        _core.diag_mimalloc_collect(True)
        maps = self._maps()
        committed = 0
        small_large = None
        if not self.footprint and self._walkable:
            walk = self._walk()
            committed = walk.committed
            small_large = (walk.small, walk.large)
        self.last = (maps, committed, small_large)
        return self.parts(self.last)

    def parts(self, raw: Raw) -> tuple[dict[str, int], int]:
        """(parts, owned bytes) from what :meth:`read` kept, with every address known now."""
        maps, committed, small_large = raw
        if small_large is None:
            resident = self.resident(maps)
            return {"resident": resident}, resident
        # 2.x: live threads' heaps cannot be visited; what grows in mimalloc's mappings
        # outside this thread's heap is judged in judge_outside.
        return {"small": small_large[0], "large": small_large[1]}, committed


_instance: Mimalloc | None = None


def instance() -> Mimalloc:
    """The process's :class:`Mimalloc` (made on first use; AttributeError/OSError when
    mimalloc's heap cannot be visited)."""
    global _instance
    if _instance is None:
        _instance = Mimalloc()
    return _instance


def current() -> Mimalloc | None:
    """The :class:`Mimalloc` made so far, or None."""
    return _instance


class PurgeHold:
    """mimalloc's purge delay held at 0 from a snapshot to its diagnosis.

    With a delay, mimalloc gives back a freed page 25 ms (2.0) to 1 s (3.x) later, on a timer:
    two readings taken back to back then differ by what came due between them (measured: up to
    8 MiB at load 4, when 4 KiB at rest), and that jitter raises every threshold (8 times it) over
    a steady leak of a few MiB per run. At 0, a page goes back when it is freed: what the readings
    see follows what the workload did, not the clock. The previous delay is put back by
    :meth:`release` (idempotent), unless someone set another delay meanwhile: theirs is kept.
    ``note`` says why the delay could not be held (then nothing was changed).
    """

    def __init__(self) -> None:
        self.note: str | None = None
        self._previous: int | None = None
        try:
            self._previous = _core.set_purge_delay(0)
        except UnsupportedAllocatorError as e:
            self.note = (
                f"mimalloc's purge delay could not be held at 0 ({e}): its timed purges may move"
                " RSS between readings"
            )

    def release(self) -> None:
        """Put the previous delay back (once)."""
        previous, self._previous = self._previous, None
        if previous is None or previous == 0:
            return
        now = _core.set_purge_delay(previous)
        if now != 0:  # changed by someone else since the hold: theirs stays
            _core.set_purge_delay(now)
