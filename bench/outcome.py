"""What a scenario hands back to the report: its figures and the details behind them.

Standard library, the bench's stats and its modes only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.modes import HEADLINE, Mode
from bench.sizes import Sizes
from bench.stats import Figure, figure


@dataclass(frozen=True, slots=True)
class Context:
    """Where and how big: the store to run on, a scratch directory, the knobs, and the agent's
    mode (A and B run in each; the others in the headline mode only)."""

    store: str
    workdir: Path
    sizes: Sizes
    profile_dir: Path | None = None
    mode: Mode = HEADLINE


@dataclass(slots=True)
class Outcome:
    """Figures keyed by a stable id (`A.latency_median`), with free-form details."""

    figures: dict[str, Figure] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, key: str, unit: str, reps: Sequence[float]) -> None:
        self.figures[key] = figure(key, unit, reps)

    def add_from(
        self, reps: Sequence[dict[str, float]], units: dict[str, str], prefix: str
    ) -> None:
        """One figure per key of the per-repetition dicts, named `prefix.key`."""
        for key, unit in units.items():
            self.add(f"{prefix}.{key}", unit, [rep[key] for rep in reps])


Scenario = Callable[[Context], Outcome]
