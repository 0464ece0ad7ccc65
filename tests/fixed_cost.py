"""A speculation tick cost that the engine's ticks do not refit: tests that must see guesses
placed (or their placement decided by a known cost) pin it in place of the fitted one."""
from __future__ import annotations

from llamabatch.core.speculation import TickCost


class FixedCost(TickCost):
    """TickCost with its coefficients as given, whatever the ticks measure."""

    def observe(self, runs: int, rows: int, logit_rows: int, ms: float) -> None:
        pass
