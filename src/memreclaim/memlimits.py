"""The memory limit this process runs under, and where it comes from: the package's one cgroup
discovery (the runners, the pressure watcher and the metrics read their cgroup through it).

    >>> import memreclaim
    >>> lim = memreclaim.limits()
    >>> lim.source, lim.limit, lim.target()      # e.g. ('cgroup1', 536870912, 483183820)

Sources, the tightest wins:

- ``cgroup2``: ``memory.max`` (hard) and ``memory.high`` (throttling) of this process's cgroup
  and of every ancestor up to the cgroup2 mount, found through ``/proc/self/cgroup`` and
  ``/proc/self/mountinfo``; ``memory.current`` and the ``memory.events`` counters of its own cgroup.
- ``cgroup1``: ``memory.limit_in_bytes`` (hard) and ``memory.soft_limit_in_bytes`` of the memory
  controller's cgroup and its ancestors; ``memory.usage_in_bytes``, ``memory.memsw.*`` (memory plus
  swap), ``memory.failcnt`` and the ``oom_kill`` counter of ``memory.oom_control``.
- ``rlimit_as`` / ``rlimit_data``: ``RLIMIT_AS`` / ``RLIMIT_DATA``. They bound address space, not
  resident memory, so they are an upper bound only (glibc reserves address space it never touches).
- ``none``: nothing applies. An unlimited cgroup reports a huge number (``max`` in v2,
  ``9223372036854771712`` in v1): anything at or above :data:`UNLIMITED` counts as no limit.

:func:`cgroup_dirs` gives this process's cgroup directories (v2 and the v1 memory controller's,
innermost first) for the readers that watch a cgroup's files (PSI, ``memory.events``).

Read once and cached (a few small file reads); :func:`limits` ``(refresh=True)`` reads again,
e.g. after the container was resized. ``current`` and ``events`` are figures of the moment of the
read: refresh to see new ones.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from . import _validate

__all__ = [
    "UNLIMITED",
    "CgroupDirs",
    "Limits",
    "auto_limit",
    "cgroup_dirs",
    "find_sources",
    "limits",
    "parse_counters",
    "read_limits",
]

UNLIMITED = 1 << 60
"""A limit at or above this many bytes (1 EiB) is treated as no limit."""

DEFAULT_FRACTION = 0.9
"""The share of the hard limit :meth:`Limits.target` keeps RSS under by default."""


@dataclass(frozen=True)
class Limits:
    """The effective memory limit of a process and where it comes from. Sizes in bytes.

    ``limit`` is the hard limit (``None``: none); ``high`` the soft one the kernel throttles or
    reclaims at (cgroup v2 ``memory.high``, cgroup v1 ``memory.soft_limit_in_bytes``; ``None``:
    unset); ``source`` one of ``"cgroup2"``, ``"cgroup1"``, ``"rlimit_as"``, ``"rlimit_data"``,
    ``"none"``; ``path`` the cgroup directory (or rlimit name) the limit was read from;
    ``current`` the cgroup's usage at the read; ``swap_limit`` the cgroup's memory+swap limit
    (v1 ``memsw``) or swap limit (v2 ``memory.swap.max``); ``events`` the cgroup's counters
    (v2 ``memory.events``; v1 ``failcnt`` and ``oom_kill``); ``notes`` what could not be read.
    """

    source: str
    limit: int | None
    high: int | None = None
    current: int | None = None
    swap_limit: int | None = None
    path: str | None = None
    cgroup: str | None = None
    events: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = ()

    def target(self, fraction: float = DEFAULT_FRACTION) -> int | None:
        """The RSS to keep under, in bytes, or ``None`` when no limit applies.

        ``fraction`` of the hard limit (default 90%), or ``high`` when that is lower.
        """
        fraction = _validate.fraction("fraction", fraction, allow_zero=False)
        candidates = []
        if self.limit is not None:
            candidates.append(int(self.limit * fraction))
        if self.high is not None:
            candidates.append(self.high)
        return min(candidates) if candidates else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _bytes(text: str | None) -> int | None:
    """A limit file's value in bytes; ``None`` for unreadable, ``max`` or huge values."""
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED or value < 0 else value


def parse_counters(text: str | None) -> dict[str, int]:
    """The ``name value`` lines of a flat-keyed cgroup file (``memory.events``,
    ``memory.oom_control``) as a dict; lines that are not a name and a count are skipped. The one
    parser of these files: :attr:`Limits.events` and the ``memory.events`` wake-up source.

    Raises:
        TypeError: ``text`` is neither a str nor None.
    """
    if text is not None and not isinstance(text, str):
        raise TypeError(f"text must be a str or None, not {type(text).__name__}")
    result: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            result[parts[0]] = int(parts[1])
    return result


def _unescape(path: str) -> str:
    """mountinfo octal escapes (``\\040`` for a space)."""
    if "\\" not in path:
        return path
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _mounts(root: str) -> list[tuple[str, str, str, str]]:
    """(fstype, mount root within the hierarchy, mount point, super options) from mountinfo."""
    text = _read(os.path.join(root, "proc/self/mountinfo")) or ""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), tail[2]))
    return mounts


def _cgroup_dirs(root: str, mount_root: str, mount_point: str, cgroup: str) -> list[str]:
    """The cgroup's directory and its ancestors up to the mount point, innermost first."""
    rel = os.path.relpath(cgroup, mount_root) if mount_root != "/" else cgroup.lstrip("/")
    if rel.startswith(".."):  # our cgroup lies outside the mounted subtree: the mount is ours
        rel = "."
    base = os.path.join(root, mount_point.lstrip("/"))
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    dirs = [os.path.join(base, *parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if os.path.isdir(d)] or [base]


def _tightest(dirs: tuple[str, ...], name: str) -> tuple[int | None, str | None]:
    best: tuple[int | None, str | None] = (None, None)
    for d in dirs:
        value = _bytes(_read(os.path.join(d, name)))
        if value is not None and (best[0] is None or value < best[0]):
            best = (value, d)
    return best


@dataclass(frozen=True)
class CgroupDirs:
    """This process's cgroup directories, innermost first (its own, then its ancestors up to the
    mount point); empty where that hierarchy is not used or not mounted.

    ``v2`` is the unified hierarchy's, ``v1`` the cgroup v1 memory controller's; ``notes`` say
    what could not be found.
    """

    v2: tuple[str, ...] = ()
    v1: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def cgroup_dirs(root: str = "/") -> CgroupDirs:
    """Find this process's cgroup directories through ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo``, read now. ``root`` prefixes every path (for tests on a fixture tree).

    Raises:
        TypeError: a ``root`` that is not a path.
    """
    if not isinstance(root, str | os.PathLike):
        raise TypeError(f"root must be a path, not {type(root).__name__}")
    root = os.fspath(root)
    text = _read(os.path.join(root, "proc/self/cgroup"))
    if text is None:
        return CgroupDirs(notes=("/proc/self/cgroup is not readable",))
    notes: list[str] = []
    v2_path, v1_path = None, None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    mounts = _mounts(root)
    v1: list[str] = []
    v2: list[str] = []
    if v1_path is not None:
        mount = next((m for m in mounts if m[0] == "cgroup" and "memory" in m[3].split(",")), None)
        if mount is None:
            notes.append("a cgroup v1 memory controller is listed but not mounted")
        else:
            v1 = _cgroup_dirs(root, mount[1], mount[2], v1_path)
    if v2_path is not None:
        mount = next((m for m in mounts if m[0] == "cgroup2"), None)
        if mount is None:
            notes.append("no cgroup2 mount in /proc/self/mountinfo")
        else:
            v2 = _cgroup_dirs(root, mount[1], mount[2], v2_path)
    return CgroupDirs(v2=tuple(v2), v1=tuple(v1), notes=tuple(notes))


def find_sources(root: str = "/") -> tuple[str | None, str | None]:
    """(the PSI file, the ``memory.events`` file) of this process, or None where there is none:
    what the runners' wake-ups and the pressure watcher watch.

    The cgroup v2 ``memory.pressure`` is preferred to the system-wide ``/proc/pressure/memory``;
    ``root`` prefixes every path (for tests on a fixture tree).

    Raises:
        TypeError: a ``root`` that is not a path.
    """
    dirs = cgroup_dirs(root)
    root = os.fspath(root)
    cgroup_dir = dirs.v2[0] if dirs.v2 else None
    psi = None
    events = None
    if cgroup_dir is not None:
        if os.path.exists(os.path.join(cgroup_dir, "memory.pressure")):
            psi = os.path.join(cgroup_dir, "memory.pressure")
        if os.path.exists(os.path.join(cgroup_dir, "memory.events")):
            events = os.path.join(cgroup_dir, "memory.events")
    if psi is None and os.path.exists(os.path.join(root, "proc/pressure/memory")):
        psi = os.path.join(root, "proc/pressure/memory")
    return psi, events


# Each hierarchy's files: the hard limit, the soft one (v2 memory.high, v1's soft limit), the
# swap limit and the usage.
_FILES = {
    "cgroup2": ("memory.max", "memory.high", "memory.swap.max", "memory.current"),
    "cgroup1": (
        "memory.limit_in_bytes",
        "memory.soft_limit_in_bytes",
        "memory.memsw.limit_in_bytes",
        "memory.usage_in_bytes",
    ),
}


def _limits_of(source: str, dirs: tuple[str, ...], events: dict[str, int]) -> Limits:
    """The Limits of the cgroup ``dirs[0]`` (its ancestors after it) in hierarchy ``source``."""
    limit_file, high_file, swap_file, current_file = _FILES[source]
    own = dirs[0]
    limit, where = _tightest(dirs, limit_file)
    high, high_where = _tightest(dirs, high_file)
    swap, _ = _tightest(dirs, swap_file)
    return Limits(
        source=source,
        limit=limit,
        high=high,
        current=_bytes(_read(os.path.join(own, current_file))),
        swap_limit=swap,
        path=where or high_where or own,
        cgroup=own,
        events=MappingProxyType(events),
    )


def _from_cgroup2(dirs: tuple[str, ...]) -> Limits | None:
    own = dirs[0]
    if (
        _read(os.path.join(own, "memory.max")) is None
        and _read(os.path.join(own, "memory.current")) is None
    ):
        return None  # the memory controller is not enabled for this cgroup
    return _limits_of("cgroup2", dirs, parse_counters(_read(os.path.join(own, "memory.events"))))


def _from_cgroup1(dirs: tuple[str, ...]) -> Limits | None:
    own = dirs[0]
    if _read(os.path.join(own, "memory.limit_in_bytes")) is None:
        return None
    events: dict[str, int] = {}
    failcnt = _read(os.path.join(own, "memory.failcnt"))
    if failcnt is not None and failcnt.isdigit():
        events["failcnt"] = int(failcnt)
    oom = parse_counters(_read(os.path.join(own, "memory.oom_control")))
    if "oom_kill" in oom:
        events["oom_kill"] = oom["oom_kill"]
    return _limits_of("cgroup1", dirs, events)


def _from_cgroups(root: str) -> tuple[Limits | None, list[str]]:
    dirs = cgroup_dirs(root)
    found = [
        lim
        for lim in (
            _from_cgroup1(dirs.v1) if dirs.v1 else None,
            _from_cgroup2(dirs.v2) if dirs.v2 else None,
        )
        if lim is not None
    ]
    if not found:
        return None, list(dirs.notes)
    # Both hierarchies can hold a memory controller only in odd set-ups: keep the tighter.
    found.sort(key=lambda lim: (lim.limit is None, lim.limit or 0))
    return found[0], list(dirs.notes)


def read_limits(root: str = "/") -> Limits:
    """Read the limits now, uncached. ``root`` prefixes ``/proc`` and every cgroup mount point
    (for tests on a fixture tree); the rlimits are always this process's own."""
    if not isinstance(root, str | os.PathLike):
        raise TypeError(f"root must be a path, not {type(root).__name__}")
    root = os.fspath(root)
    cgroup, notes = _from_cgroups(root)
    candidates: list[Limits] = []
    if cgroup is not None:
        candidates.append(cgroup)
    for name, which in (("rlimit_as", resource.RLIMIT_AS), ("rlimit_data", resource.RLIMIT_DATA)):
        soft, _hard = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY and 0 <= soft < UNLIMITED:
            candidates.append(Limits(source=name, limit=soft, path=name.upper()))
    limited = [c for c in candidates if c.limit is not None]
    if limited:
        best = min(limited, key=lambda c: c.limit or 0)
        if best.source.startswith("rlimit") and cgroup is not None:
            # keep the cgroup's figures (usage, events, high), with the rlimit as the limit
            best = replace(cgroup, source=best.source, limit=best.limit, path=best.path)
        return _with_notes(best, notes)
    if cgroup is not None:  # no hard limit, but maybe memory.high, and usage figures
        source = cgroup.source if cgroup.high is not None else "none"
        path = cgroup.path if cgroup.high is not None else None
        return _with_notes(replace(cgroup, source=source, path=path), notes)
    return Limits(source="none", limit=None, notes=tuple(notes))


def _with_notes(lim: Limits, notes: list[str]) -> Limits:
    return replace(lim, notes=(*lim.notes, *notes)) if notes else lim


_lock = threading.Lock()
_cached: Limits | None = None


def limits(refresh: bool = False) -> Limits:
    """The effective memory limit of this process (a frozen :class:`Limits`), read once and
    cached; ``refresh=True`` reads the files again. ``limits().target()`` is the RSS to keep
    under in bytes, or ``None``."""
    global _cached
    refresh = _validate.flag("refresh", refresh)
    with _lock:
        if _cached is None or refresh:
            _cached = read_limits()
        return _cached


def auto_limit(refresh: bool = False) -> int | None:
    """The soft limit ``limit="auto"`` keeps RSS under, in bytes: the lower of the cgroup's hard
    limit and its ``memory.high`` (v1: ``memory.soft_limit_in_bytes``), or None (no limit).

    An ``RLIMIT_AS``/``RLIMIT_DATA`` limit is not used: it bounds address space, which trimming
    does not reduce; only ``memory.high``, when set, is taken alongside it. Reads :func:`limits`
    (cached; ``refresh=True`` reads the files again).

    Raises:
        TypeError: a ``refresh`` that is not a bool.
    """
    found = limits(refresh)
    bounds = [found.high] if found.source.startswith("rlimit") else [found.limit, found.high]
    present = [bound for bound in bounds if bound is not None]
    return min(present) if present else None


# Moved to memreclaim.runners.wakeups, the one wake-up multiplexer (one release, then gone).
# Reached by name on first use, like memreclaim/__init__'s table: importing memlimits imports no
# runner.
_MOVED = ("UsageAlarm", "usage_alarm")


def __getattr__(name: str) -> object:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from . import _deprecated

    home = "memreclaim.runners.wakeups"
    value = getattr(importlib.import_module(home), name)
    return _deprecated.lookup(__name__, name, {name: (f"{home}.{name}", value)})


def _reset_in_child() -> None:
    global _lock, _cached
    _lock = threading.Lock()
    _cached = None  # a child may be moved to another cgroup before it asks


os.register_at_fork(after_in_child=_reset_in_child)
