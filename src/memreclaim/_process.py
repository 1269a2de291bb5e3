"""Another process's memory, as the C core reads its /proc files: :func:`memreclaim.inspect`.

The api layer's view of ``/proc/PID/status``, ``smaps_rollup`` and ``maps`` (the core's
``process_status``, ``process_rollup`` and ``process_heap_mapping`` readers): no /proc file is
parsed here. Imported on first use of ``memreclaim.inspect`` (``dataclasses`` is not cheap).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _core

__all__ = ["ProcessMemory", "inspect"]


@dataclass(frozen=True)
class ProcessMemory:
    """Process ``pid``'s memory in bytes: what :func:`memreclaim.inspect` returns.

    The ``/proc/PID/status`` figures are always there (that file is world-readable); the
    ``smaps_rollup`` ones (``pss`` to ``anon_huge_pages``) and ``heap_mapping`` are None when
    they cannot be read, and ``notes`` says why for each (e.g. no ptrace access, no
    smaps_rollup before Linux 4.14). ``memreclaim.asdict()`` turns it into a dict.
    """

    pid: int
    name: str
    """The command name (``Name:`` in /proc/PID/status)."""
    threads: int | None
    rss: int | None
    rss_anon: int | None
    rss_file: int | None
    rss_shmem: int | None
    swap: int | None
    peak_rss: int | None
    """The high-water mark of resident bytes (VmHWM)."""
    virtual: int | None
    """The virtual size (VmSize)."""
    pss: int | None
    private_dirty: int | None
    shared_clean: int | None
    anonymous: int | None
    anon_huge_pages: int | None
    heap_mapping: int | None
    """The size of the ``[heap]`` mapping (glibc's main arena, grown by brk), or None."""
    notes: tuple[str, ...] = ()
    """One line per figure that could not be read, saying why."""


_ROLLUP_KEYS = ("pss", "private_dirty", "shared_clean", "anonymous", "anon_huge_pages")


def _why(what: str, exc: OSError) -> str:
    """A note for a /proc file that could not be read (the process itself exists)."""
    if isinstance(exc, PermissionError):
        return (
            f"{what}: permission denied reading {exc.filename}: it needs ptrace access (the"
            " process's own user, or root with CAP_SYS_PTRACE)"
        )
    return f"{what}: {exc.strerror or exc} ({exc.filename})"


def inspect(pid: int) -> ProcessMemory:
    """The RSS breakdown of process ``pid`` (any process, Python or not), read from its
    ``/proc/PID/status``, ``smaps_rollup`` and ``maps`` by the C core; nothing runs in it.

    What ``python -m memreclaim inspect PID`` prints. Figures that cannot be read (another
    user's process without ptrace access, an old kernel) are None, with a note saying why.

    Raises:
        TypeError: ``pid`` is not an int (a bool neither).
        ValueError: ``pid`` is not a positive process ID (1 to 2**31 - 1).
        ProcessLookupError: no such process (or it exited while being read).
        OSError: its ``/proc/PID/status`` cannot be read (e.g. PermissionError under a
            hardened ``hidepid`` mount).
    """
    from . import asdict  # the package is imported by then (this module loads on first use)

    figures: dict[str, object] = asdict(_core.process_status(pid))
    figures.update(dict.fromkeys(_ROLLUP_KEYS))
    notes: list[str] = []
    try:
        figures.update(asdict(_core.process_rollup(pid)))
    except ProcessLookupError:
        raise
    except OSError as exc:
        notes.append(_why("smaps_rollup", exc))
    try:
        figures["heap_mapping"] = _core.process_heap_mapping(pid)
    except ProcessLookupError:
        raise
    except OSError as exc:
        figures["heap_mapping"] = None
        notes.append(_why("maps", exc))
    return ProcessMemory(pid=pid, notes=tuple(notes), **figures)  # type: ignore[arg-type]
