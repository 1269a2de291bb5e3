"""``stats``, ``trim --pid`` and ``inspect PID``: a process's memory figures.

``--json`` prints results as :func:`memreclaim.asdict` turns them into dicts: ``stats`` the same
document as ``stats --pid``'s ``result`` (:func:`memreclaim.remote._figures`), ``trim --pid``
every :class:`memreclaim.TrimResult` field, ``inspect`` every :class:`memreclaim.ProcessMemory`
field. ``inspect`` reads the other process's /proc files through :func:`memreclaim.inspect`: the
command line parses no /proc file itself.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import memreclaim
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
        _print_figures(answer["result"])
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """``stats``: this interpreter's memory figures."""
    if getattr(args, "pid", None) is not None:
        return cmd_remote(args)
    from memreclaim.remote import _figures

    data = _figures()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        _print_figures(data)
    return 0


def _print_figures(data: dict[str, Any]) -> None:
    """The text form of a ``stats`` document (this process's, or another's with ``--pid``)."""
    version = f" {data['allocator_version']}" if data.get("allocator_version") else ""
    pid, python = data.get("pid", "?"), data.get("python", "?")
    print(f"pid {pid}, Python {python}, allocator {data['allocator']}{version}")
    for key in ("rss", "rss_anon", "rss_file", "rss_shmem", "peak_rss", "swap"):
        print(f"  {key:<16} {show_size(data.get(key))}")
    heap = data.get("heap")
    if heap is not None:
        print(f"  {'heap in use':<16} {show_size(heap['in_use'])}")
        print(f"  {'heap free':<16} {show_size(heap['free'])}")
        print(f"  {'heap mapped':<16} {show_size(heap['mapped'])}")


def inspect_pid(pid: int) -> dict[str, Any]:
    """:func:`memreclaim.inspect` as a dict (:func:`memreclaim.asdict`), its errors as
    :class:`CliError`.

    Raises:
        CliError: no such process, or its /proc/PID/status is not readable.
    """
    try:
        return memreclaim.asdict(memreclaim.inspect(pid))
    except ProcessLookupError:
        raise CliError(f"no process with PID {pid}") from None
    except PermissionError as exc:
        raise CliError(
            f"permission denied reading {exc.filename}: it needs ptrace access (the process's"
            " own user, or root with CAP_SYS_PTRACE)"
        ) from None
    except OSError as exc:
        raise CliError(f"{exc.strerror or exc} ({exc.filename})") from None


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
