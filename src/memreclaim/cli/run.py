"""``run``: a Python program run in this process with a periodic trimmer, reported at exit."""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
import time

import memreclaim
from memreclaim.units import format_bytes

from ._common import CliError, show_size


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``run``: execute a script or module in this process with the trimmer running.

    ``--min-interval`` left out (None) takes the pacing policy's own default.
    """
    from memreclaim.watchdog import BackgroundTrimmer  # the policy layer, only when needed

    try:
        trimmer = BackgroundTrimmer(
            interval=args.interval, slack=args.slack, min_interval=args.min_interval
        )
    except (TypeError, ValueError) as exc:  # e.g. a min interval past the back-off cap
        parser.error(f"run: {exc}")
    argv: list[str] = args.argv
    if args.module is None:
        if not argv:
            parser.error("run: give a script (run -- script.py args) or a module (run -m mod)")
        script = argv[0]
        if not os.path.isfile(script):
            raise CliError(f"cannot run {script!r}: no such file")
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
    trimmer.start()
    start = time.perf_counter()
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
        trimmer.stop()
        elapsed = time.perf_counter() - start
        st = memreclaim.stats()
        done = trimmer.counters
        print(
            f"memreclaim run: {elapsed:.1f} s, peak RSS {show_size(st.peak_rss)}, RSS now"
            f" {show_size(st.rss)}; {done.trims} trim(s) released"
            f" {format_bytes(done.bytes_released)} in {done.trim_seconds * 1000:.1f} ms"
            f" (interval {args.interval:g} s, slack {format_bytes(args.slack)}, min interval"
            f" {trimmer.policy.min_interval:g} s)",
            file=sys.stderr,
        )
    return status
