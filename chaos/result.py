"""What a scenario answers: its figures and the invariants it saw broken.

A scenario is a module of this package with `NAME`, a one-line `SUMMARY` and
`run(scale, workdir) -> Result`. `Scale.CI` is the small configuration the test suite runs (a few
seconds each); `Scale.FULL` is what `make chaos` runs, every scenario together in well under 15
minutes on two cores. A scenario never raises for a broken invariant: it names it in `failures`,
so one run reports every figure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

Figure = float | int | bool | str


class Scale(enum.Enum):
    CI = "ci"
    FULL = "full"


@dataclass
class Result:
    name: str
    figures: dict[str, Figure] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def expect(self, ok: bool, failure: str) -> None:
        """Records `failure` unless `ok`."""
        if not ok:
            self.failures.append(failure)


class Scenario(Protocol):
    NAME: str
    SUMMARY: str

    def run(self, scale: Scale, workdir: Path) -> Result: ...
