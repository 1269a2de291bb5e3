"""``stats``, ``trim --pid`` and ``inspect PID``: a process's memory figures.

``inspect`` reads another process's /proc files through the core's readers
(``memreclaim._core.process_status``, ``process_rollup``, ``process_heap_mapping``): the command
line parses no /proc file itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Any

import memreclaim
from memreclaim import _core
from memreclaim.units import format_bytes

from ._common import CliError, show_size


def cmd_remote(args: argparse.Namespace) -> int:
    """``trim --pid`` / ``stats --pid``: run the command inside another process."""
    from memreclaim import remote

    try:
        answer = remote.request(
            args.pid,
            args.command,
            pools=getattr(args, "pools", False),
            timeout=getattr(args, "timeout", 30.0),
            method=getattr(args, "method", "auto"),
        )
    except (OSError, remote.RemoteError) as exc:
        raise CliError(str(exc)) from None
    if "error" in answer:
        raise CliError(f"process {args.pid}: {answer['error']}")
    if args.command == "trim" and answer["result"]["method"] == "none":
        if args.json:
            print(json.dumps(answer, indent=2))
        raise CliError(
            f"process {args.pid}: its allocator was not detected"
            f" ({answer['result']['allocator']}): nothing was trimmed"
        )
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.command == "trim":
        r = answer["result"]
        released = "unknown" if r["released"] is None else format_bytes(r["released"])
        print(
            f"pid {args.pid} ({answer['via']}): released {released}"
            f" ({r['allocator']} {r['method']}, {r['seconds'] * 1000:.1f} ms)"
        )
    else:
        for key, value in answer["result"].items():
            print(f"{key:16} {value}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """``stats``: this interpreter's memory figures."""
    if getattr(args, "pid", None) is not None:
        return cmd_remote(args)
    try:
        st = memreclaim.stats(heap=True)
    except memreclaim.UnsupportedAllocatorError:  # an allocator without statistics
        st = memreclaim.stats()
    heap = st.heap
    data: dict[str, Any] = {
        "pid": os.getpid(),
        "python": platform.python_version(),
        "allocator": st.allocator,
        "allocator_version": memreclaim.allocator_version(),
        "rss": st.rss,
        "rss_anon": st.rss_anon,
        "rss_file": st.rss_file,
        "rss_shmem": st.rss_shmem,
        "peak_rss": st.peak_rss,
        "swap": st.swap,
        "traced_current": st.traced_current,
        "traced_peak": st.traced_peak,
        "heap": None
        if heap is None
        else {
            "in_use": heap.in_use,
            "free": heap.free,
            "mapped": heap.mapped,
            "figures": heap.figures,
        },
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    version = f" {data['allocator_version']}" if data["allocator_version"] else ""
    print(f"pid {data['pid']}, Python {data['python']}, allocator {st.allocator}{version}")
    for key in ("rss", "rss_anon", "rss_file", "rss_shmem", "peak_rss", "swap"):
        print(f"  {key:<16} {show_size(data[key])}")
    if heap is not None:
        print(f"  {'heap in use':<16} {show_size(heap.in_use)}")
        print(f"  {'heap free':<16} {show_size(heap.free)}")
        print(f"  {'heap mapped':<16} {show_size(heap.mapped)}")
    return 0


_ROLLUP_KEYS = ("pss", "private_dirty", "shared_clean", "anonymous", "anon_huge_pages")


def _why(exc: OSError) -> str:
    """A note for a /proc file that could not be read (the process itself exists)."""
    if isinstance(exc, PermissionError):
        return (
            f"permission denied reading {exc.filename}: it needs ptrace access (the process's"
            " own user, or root with CAP_SYS_PTRACE)"
        )
    return f"{exc.strerror or exc} ({exc.filename})"  # e.g. no smaps_rollup before Linux 4.14


def inspect_pid(pid: int) -> dict[str, Any]:
    """RSS breakdown of process ``pid``: /proc/PID/status, smaps_rollup and the [heap] mapping,
    as the core reads them. What cannot be read is None, with a note saying why.

    Raises:
        CliError: no such process, or its /proc/PID/status is not readable.
    """
    try:
        status = _core.process_status(pid)
    except ProcessLookupError:
        raise CliError(f"no process with PID {pid}") from None
    except OSError as exc:
        raise CliError(_why(exc)) from None
    data: dict[str, Any] = {"pid": pid, **status}
    data.update(dict.fromkeys(_ROLLUP_KEYS))
    notes: list[str] = []
    try:
        data.update(_core.process_rollup(pid))
    except ProcessLookupError:  # it exited while we read
        raise CliError(f"no process with PID {pid}") from None
    except OSError as exc:
        notes.append(f"smaps_rollup: {_why(exc)}")
    try:
        data["heap_mapping"] = _core.process_heap_mapping(pid)
    except ProcessLookupError:
        raise CliError(f"no process with PID {pid}") from None
    except OSError as exc:
        data["heap_mapping"] = None
        notes.append(f"maps: {_why(exc)}")
    data["notes"] = notes
    return data


def cmd_inspect(args: argparse.Namespace) -> int:
    """``inspect PID``: another process's RSS breakdown."""
    data = inspect_pid(args.pid)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"pid {data['pid']} ({data['name']}), {data['threads']} thread(s)")
    rows = [
        ("rss", "resident"),
        ("rss_anon", "  anonymous"),
        ("rss_file", "  file-backed"),
        ("rss_shmem", "  shared memory"),
        ("swap", "swapped out"),
        ("peak_rss", "peak resident (VmHWM)"),
        ("pss", "proportional (Pss)"),
        ("private_dirty", "private dirty"),
        ("heap_mapping", "[heap] mapping (brk)"),
        ("virtual", "virtual size"),
    ]
    for key, label in rows:
        print(f"  {label:<24} {show_size(data[key]):>11}")
    for note in data["notes"]:
        print(f"  note: {note}")
    return 0
