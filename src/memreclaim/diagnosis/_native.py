"""Who allocates a native leak: the function and shared object of the growing blocks.

Only when a measurement found a native leak, and only where memray is installed (pytest-memray
brings it): the workload runs ``repeat`` more times under memray's tracker with native traces,
and memray's reader gives the blocks still allocated at the end, grouped by stack. The largest
group's innermost named native frame is the allocating function; its shared object is the
loaded object that defines that name (the C core reads the objects' dynamic symbol tables:
memray names the function, not always its file). memray was chosen over sampling backtraces
in C because glibc has no malloc hooks any more, an interposed malloc would slow every run, and
memray's tracker is made for this and is paid only on this extra pass.

The pass runs under glibc's malloc only. memray hooks every loaded object's calls to ``mmap``,
the allocator's own among them, and its hook allocates: jemalloc maps new extents while holding
an arena lock, so the hook's allocation waits for that lock in the same thread and the process
hangs for good (seen with Debian's jemalloc 5.3 preloaded under CPython 3.13). glibc's malloc
maps through its internal ``__mmap``, which the hook never sees. tcmalloc (which defines ``mmap``
itself) and mimalloc also map from inside the allocator through calls the hook sees, so they are
skipped on the same grounds, as is an allocator memreclaim does not know.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

from .. import _core
from ..units import format_bytes

_UNKNOWN = "<unknown>"


@dataclass(frozen=True)
class NativeSite:
    """The blocks a native leak left, grouped by the stack that allocated them."""

    function: str
    library: str | None  # the shared object that defines ``function``
    size: int
    count: int
    callers: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """``function in library`` (or the function alone when its object is not found)."""
        return f"{self.function} in {self.library}" if self.library else self.function

    def __str__(self) -> str:
        text = f"{self.where}: +{format_bytes(self.size)} in {self.count} blocks"
        if self.callers:
            text += " (called from " + ", ".join(self.callers) + ")"
        return text


def library_of(function: str) -> str | None:
    """The shared object that defines ``function`` (among those loaded), or None: the C core
    reads each loaded object's dynamic symbol table (extensions loaded ``RTLD_LOCAL`` too)."""
    return _core._symbol_object(function)


class NativeTrace:
    """``with NativeTrace(allocator) as trace: runs...`` then ``trace.sites()``: the largest
    groups of blocks still allocated at the end of the block, by stack, or a sentence saying why
    they cannot be named (memray missing, another tracker active, an allocator other than glibc's
    malloc, under which memray's hooks can hang the process)."""

    def __init__(self, allocator: str) -> None:
        self._allocator = allocator
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._tracker: Any = None
        self.reason: str | None = None

    def __enter__(self) -> NativeTrace:
        if self._allocator != "glibc":
            self.reason = (
                f"memray's native tracker is run under glibc's malloc only (here {self._allocator}:"
                " memray's hook on the allocator's own mmap calls allocates again while the"
                " allocator holds its lock, which can hang the process): the allocating function"
                " is not named"
            )
            return self
        try:
            import memray
        except ImportError:
            self.reason = "memray is not installed: the allocating function is not named"
            return self
        self._folder = tempfile.TemporaryDirectory(prefix="memreclaim-")
        path = os.path.join(self._folder.name, "native.bin")
        tracker = memray.Tracker(
            path, native_traces=True, file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS
        )
        try:
            tracker.__enter__()
        except (RuntimeError, OSError) as exc:  # another tracker is active (pytest --memray)
            self.reason = f"memray could not trace the extra runs ({exc})"
            self._folder.cleanup()
            return self
        self._tracker, self._path = tracker, path
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)

    def sites(self, top: int = 3) -> tuple[NativeSite, ...] | str:
        """The named groups, largest first (read once the block has ended)."""
        if self.reason is not None or self._tracker is None:
            return self.reason or "memray did not trace"
        import memray

        try:
            reader = memray.FileReader(self._path)
            records = reader.get_leaked_allocation_records(merge_threads=True)
            groups = sorted(records, key=lambda r: -r.size)
            return tuple(site for r in groups[:top] if (site := _site(r)) is not None)
        except (OSError, RuntimeError, ValueError) as exc:  # a damaged or partial capture
            return f"memray's capture could not be read ({exc})"
        finally:
            if self._folder is not None:
                self._folder.cleanup()


def _site(record: object) -> NativeSite | None:
    frames = [f for f in record.hybrid_stack_trace() if f[0] != _UNKNOWN]  # type: ignore[attr-defined]
    native = [f for f in frames if f[1] == _UNKNOWN or not f[1].endswith(".py")]
    if not native:
        return None
    function = native[0][0]
    callers = tuple(f[0] for f in native[1:3])
    size, count = record.size, record.n_allocations  # type: ignore[attr-defined]
    return NativeSite(function, library_of(function), size, count, callers)
