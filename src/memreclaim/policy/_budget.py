"""The CPU budget: the time spent trimming may not exceed ``fraction`` of wall time, with a
credit of ``fraction * window`` seconds (a 1 % budget over 300 s allows 3 s of trims at once).
An expensive trim pushes the next one back by its measured cost, a cheap one does not."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BudgetState", "CpuBudget"]


@dataclass
class BudgetState:
    """Seconds of credit at ``at`` (negative: in debt)."""

    credit: float = 0.0
    at: float = 0.0


class CpuBudget:
    """Trims paced to ``fraction`` of wall time over ``window`` seconds of credit."""

    def __init__(self, fraction: float, window: float) -> None:
        self.fraction = fraction
        self.window = window
        self.state = BudgetState()

    def start(self, now: float) -> None:
        """Full credit at ``now``."""
        self.state = BudgetState(self.fraction * self.window, now)

    def credit(self, now: float) -> float:
        """Seconds of trim time the budget allows at ``now`` (negative: in debt)."""
        cap = self.fraction * self.window
        state = self.state
        return min(cap, state.credit + max(0.0, now - state.at) * self.fraction)

    def charge(self, now: float, seconds: float) -> None:
        """A trim that ended at ``now`` took ``seconds``."""
        self.state = BudgetState(self.credit(now) - seconds, now)
