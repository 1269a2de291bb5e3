"""``run``: a Python program run in this process with a periodic trimmer, reported at exit.

The trimmer follows the program's processes (:mod:`memreclaim.runners.autostart`): a forked
child (a gunicorn worker, a Celery prefork process) starts its own in a fork handler, a spawned
interpreter (``uvicorn --workers``) through the ``MEMRECLAIM`` variables ``run`` exports and the
start-up hook. Each process that ends through this command's frames (the forked ones do: they
return through ``runpy``) prints its own exit line, naming its pid when it is not the first.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import stat
import sys
import time

import memreclaim
from memreclaim.units import format_bytes

from ._common import CliError, show_size

_started = time.perf_counter()  # this process's start, reset in each forked child
_first_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _started
    _started = time.perf_counter()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_script(script: str) -> None:
    """What ``runpy.run_path`` can run: a readable file, or a directory (or zip) with a
    ``__main__.py``; else a CliError saying what ``script`` is."""
    try:
        mode = os.stat(script).st_mode
    except FileNotFoundError:
        raise CliError(f"cannot run {script!r}: no such file") from None
    except OSError as exc:
        raise CliError(f"cannot run {script!r}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        if not os.path.isfile(os.path.join(script, "__main__.py")):
            raise CliError(f"cannot run {script!r}: a directory without __main__.py")
        return
    if not stat.S_ISREG(mode):
        kind = {
            stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device",
            stat.S_IFIFO: "a FIFO",
            stat.S_IFSOCK: "a socket",
        }.get(stat.S_IFMT(mode), "not a regular file")
        raise CliError(f"cannot run {script!r}: it is {kind}, not a Python script")
    if not os.access(script, os.R_OK):
        raise CliError(f"cannot run {script!r}: permission denied")


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``run``: execute a script or module in this process with the trimmer running.

    ``--min-interval`` left out (None) takes the pacing policy's own default;
    ``MEMRECLAIM_LOG`` in the environment sets up the ``memreclaim`` logger as with
    ``MEMRECLAIM=1`` (:mod:`memreclaim.runners.autostart`).
    """
    global _started, _first_pid
    from memreclaim.policy import PacingPolicy  # the policy layer, only when needed
    from memreclaim.runners import autostart

    try:
        settings = autostart.Settings(
            interval=args.interval,
            slack=args.slack,
            min_interval=args.min_interval,
            log=os.environ.get(autostart.ENV_LOG, "").strip().lower() or None,
            limit=autostart.parse_limit("--limit", args.limit),
        )
        if args.min_interval is not None:  # e.g. a min interval past the back-off cap
            PacingPolicy(min_interval=args.min_interval)
    except (TypeError, ValueError) as exc:
        parser.error(f"run: {exc}")
    argv: list[str] = args.argv
    if args.module is None:
        if not argv:
            parser.error("run: give a script (run -- script.py args) or a module (run -m mod)")
        script = argv[0]
        _check_script(script)
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    else:
        sys.argv = [args.module, *argv]
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(args.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise CliError(f"no module named {args.module!r}")
    trimmer = autostart.activate(settings, export=True)
    _started, _first_pid = time.perf_counter(), os.getpid()
    status: int = 0
    try:
        if args.module is None:
            runpy.run_path(sys.argv[0], run_name="__main__")
        else:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    finally:
        # a forked child returns here too, with its own trimmer (the parent's is not running)
        trimmer = autostart.current() or trimmer
        autostart.deactivate()
        elapsed = time.perf_counter() - _started
        st = memreclaim.stats()
        done = trimmer.counters
        who = "" if os.getpid() == _first_pid else f" (forked process {os.getpid()})"
        print(
            f"memreclaim run{who}: {elapsed:.1f} s, peak RSS {show_size(st.peak_rss)}, RSS now"
            f" {show_size(st.rss)}; {done.trims} trim(s) released"
            f" {format_bytes(done.bytes_released)} in {done.trim_seconds * 1000:.1f} ms"
            f" (interval {args.interval:g} s, slack {format_bytes(trimmer.policy.slack)},"
            f" min interval {trimmer.policy.min_interval:g} s)",
            file=sys.stderr,
        )
    return status
