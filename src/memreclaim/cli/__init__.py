"""Command line: ``python -m memreclaim`` (also the ``memreclaim`` console script).

Subcommands, each in a module of this package:

``demo``      reproduce a load spike in this process and judge it with the diagnosis engine
              (:mod:`.demo`; ``--plot`` in :mod:`.plot`);
``stats``     this interpreter's memory figures (``--json`` for machines); ``trim --pid``,
              ``stats --pid`` another process's, from inside it (:mod:`.stats`);
``inspect``   another process's RSS breakdown, as the core reads /proc/PID (:mod:`.stats`);
``run``       run a Python program with a periodic trimmer and report at exit (:mod:`.run`).

This module holds the argument parser and :func:`main`. Expected failures (a missing PID, a
missing script, matplotlib not installed) print one line on stderr and exit with status 1; bad
arguments exit with status 2 and argparse's usage message; a closed stdout exits with 141.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import memreclaim
from memreclaim import _validate

from ._common import CliError

__all__ = ["main"]

_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------
# argument parsing


def _argument(
    convert: Callable[[str], Any], check: Callable[[str, Any], _T], name: str
) -> Callable[[str], _T]:
    """An argparse ``type``: ``convert`` the text, then ``check(name, value)`` it with
    :mod:`memreclaim._validate`, so the command line accepts what the API accepts."""

    def parse(text: str) -> _T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        try:
            return check(name, value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _scale(name: str, value: float) -> float:
    if not (0 < value < float("inf")):  # a factor, not seconds or bytes: none of _validate's
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value


_positive_float = _argument(float, _scale, "value")
_seconds_arg = _argument(float, _validate.seconds, "value")
_size_arg = _argument(str, _validate.size, "value")
_pid_arg = _argument(
    int, functools.partial(_validate.integer, minimum=1, maximum=(1 << 31) - 1), "PID"
)


def _policy_min_interval() -> float:
    """The pacing policy's own default ``min_interval``: ``run``'s default, kept in one place."""
    from memreclaim.policy import PacingPolicy

    default: float = inspect.signature(PacingPolicy).parameters["min_interval"].default
    return default


def build_parser() -> argparse.ArgumentParser:
    """The ``memreclaim`` argument parser."""
    from .demo import WORKLOADS

    parser = argparse.ArgumentParser(
        prog="memreclaim",
        description="Give freed memory back to the OS, and tell allocator retention from leaks.",
    )
    parser.add_argument("--version", action="version", version=memreclaim.__version__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="reproduce a load spike here and show where the memory went",
        description="Reproduce a load spike in this process (two bursts): baseline, peak, after"
        " free, after trim, and the diagnosis engine's verdict.",
    )
    demo.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="spike",
        help="spike: a burst of 160,000 strings, every 50th kept (default); buffers: rounds of"
        " 1-5 MiB buffers; dicts: a dict of a million dicts",
    )
    demo.add_argument("--json", action="store_true", help="print the measurements as JSON")
    demo.add_argument("--plot", metavar="FILE.png", help="draw RSS over time (needs matplotlib)")
    demo.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run tracemalloc for the traced column (default: on for spike; off for dicts, where"
        " its bookkeeping would dwarf the effect, and buffers, whose retention it hides); it"
        " slows the build several times",
    )
    demo.add_argument(
        "--scale",
        type=_positive_float,
        default=1.0,
        help="multiply the workload's size by this factor (default 1)",
    )
    demo.add_argument(
        "--leak",
        action="store_true",
        help="keep every burst's survivors instead of only the last burst's: they pile up, a"
        " leak the verdict must name",
    )
    demo.add_argument(
        "--report", action="store_true", help="also print the diagnosis engine's full report"
    )

    stats = sub.add_parser("stats", help="this interpreter's memory figures")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument(
        "--pid", type=_pid_arg, help="another Python process's figures (see trim --pid)"
    )

    trim = sub.add_parser(
        "trim",
        help="trim a running Python process from outside (sys.remote_exec or its handler)",
        description="Trim process PID: through sys.remote_exec when this command runs on"
        " Python 3.14+, else through the handler the process installed with"
        " memreclaim.install_signal_handler(). See docs/containers.md.",
    )
    trim.add_argument("--pid", type=_pid_arg, required=True, help="the process to trim")
    trim.add_argument("--pools", action="store_true", help="also reclaim empty pymalloc pools")
    trim.add_argument(
        "--method", choices=("auto", "remote_exec", "signal"), default="auto", help="(auto)"
    )
    trim.add_argument(
        "--timeout", type=_positive_float, default=30.0, help="seconds to wait for it (30)"
    )
    trim.add_argument("--json", action="store_true", help="print JSON")

    insp = sub.add_parser("inspect", help="RSS breakdown of another process from /proc")
    insp.add_argument("pid", type=_pid_arg, metavar="PID")
    insp.add_argument("--json", action="store_true", help="print JSON")

    run = sub.add_parser(
        "run",
        help="run a Python program with a periodic trimmer, report at exit",
        usage="memreclaim run [--interval S] [--slack SIZE] [--min-interval S] [--limit SIZE]"
        " (-m MODULE | [--] SCRIPT) [ARGS...]",
    )
    run.add_argument(
        "--interval", type=_seconds_arg, default=1.0, help="seconds between checks (1)"
    )
    run.add_argument(
        "--slack",
        type=_size_arg,
        default=None,
        help="trim when RSS exceeds its learned level by more than this (default: the pacing"
        " policy's, max(8 MiB, level / 8), as the hooks use)",
    )
    min_interval = _policy_min_interval()
    run.add_argument(
        "--min-interval",
        type=_seconds_arg,
        default=None,
        help=f"seconds between two trims at least (default: the pacing policy's, {min_interval:g})",
    )
    run.add_argument(
        "--limit",
        default="auto",
        metavar="SIZE",
        help="the soft limit the trimmer works harder near, e.g. 700MiB; auto (default): the"
        " cgroup's, where there is one; none: no limit (also MEMRECLAIM_LIMIT)",
    )
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGS")
    return parser


def _split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``run [options] (-m MODULE | [--] SCRIPT) ARGS`` into (our options, the program's).

    Everything after the module name or the script belongs to the program, ``--help`` included,
    as with ``python -m module --help``; argparse alone would take such options for ``run``.
    """
    if not argv or argv[0] != "run":
        return argv, []
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1 :]
        if token == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if token.startswith("-m") and not token.startswith("--"):  # -mmodule, like python
            return argv[: i + 1], argv[i + 1 :]
        if token in ("--interval", "--slack", "--min-interval", "--limit"):
            i += 2
        elif token.startswith("-"):
            i += 1  # --interval=S, -h, or a mistake that argparse will report
        else:
            return argv[:i], argv[i:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m memreclaim`` and the ``memreclaim`` script; returns the status.

    A reader that leaves early (``memreclaim stats | head -1``) ends the command quietly with
    status 141 (as if killed by SIGPIPE, like other command-line tools), whenever the write
    happens: stdout is flushed here, not at interpreter exit where the error would be reported
    as "Exception ignored" and status 120.
    """
    try:
        try:
            status = _main(argv)
        except SystemExit:  # --help, --version and usage errors print, then exit
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 141


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    options, program = _split_run(argv)
    args = parser.parse_args(options)
    if args.command == "run":
        args.argv = program
    try:
        if args.command == "demo":
            from .demo import cmd_demo

            return cmd_demo(args)
        if args.command == "run":
            from .run import cmd_run

            return cmd_run(args, parser)
        from .stats import cmd_inspect, cmd_remote, cmd_stats

        if args.command == "stats":
            return cmd_stats(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        return cmd_remote(args)
    except CliError as exc:
        print(f"memreclaim {args.command}: {exc}", file=sys.stderr)
        return 1
    except memreclaim.UnsupportedAllocatorError as exc:
        print(f"memreclaim {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
