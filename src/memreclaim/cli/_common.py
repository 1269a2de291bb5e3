"""What every subcommand of the command line shares: the expected-failure exception and sizes."""

from __future__ import annotations

from memreclaim.units import format_bytes

MiB = 1 << 20


class CliError(Exception):
    """An expected failure: printed as one line on stderr, exit status 1, no traceback."""


def show_size(value: int | None) -> str:
    """A size as the tables print it: ``12.4 MiB``, or ``-`` when unknown."""
    return "-" if value is None else format_bytes(value)
