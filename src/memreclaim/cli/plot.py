"""``demo --plot``: RSS over time with the demo's phases marked, as a PNG (needs matplotlib,
imported only here and only when plotting)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from ._common import CliError, MiB

if TYPE_CHECKING:
    from .demo import DemoResult

NO_MATPLOTLIB = (
    "--plot needs matplotlib: pip install 'memreclaim[plot]' (or pip install matplotlib)"
)


def check_available() -> None:
    """Fail before any work (and without importing matplotlib) when it is not installed.

    Raises:
        CliError: matplotlib cannot be found.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise CliError(NO_MATPLOTLIB)


def plot_demo(result: DemoResult, path: str) -> None:
    """Draw RSS over time with the phases marked, into the PNG ``path``.

    Raises:
        CliError: matplotlib cannot be imported, or ``path`` cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError(NO_MATPLOTLIB) from None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    times = [t for t, _ in result.samples]
    ax.plot(times, [r / MiB for _, r in result.samples], color="tab:blue", label="RSS")
    for i, p in enumerate(result.phases):
        ax.axvline(p.seconds, color="grey", linewidth=0.6, linestyle=":")
        ax.annotate(  # every other label below the line: phases close in time stay legible
            f"{p.name}\n{p.rss / MiB:.0f} MiB",
            (p.seconds, p.rss / MiB),
            textcoords="offset points",
            xytext=(4, 4 if i % 2 == 0 else -26),
            fontsize=8,
        )
    if result.traced:
        ax.plot(
            [p.seconds for p in result.phases],
            [(p.traced or 0) / MiB for p in result.phases],
            color="tab:orange",
            marker="o",
            linestyle="none",
            label="traced (tracemalloc) at each phase",
        )
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, max(p.rss for p in result.phases) / MiB * 1.2)
    ax.set_title(f"memreclaim demo '{result.workload}' ({result.allocator}): {result.verdict}")
    ax.legend(loc="center left")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
