"""The fault-injection suite's small configuration: every registered scenario runs at
`Scale.CI` and reports no broken invariant. `make chaos` runs the same scenarios at full scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.cli import render, write
from chaos.registry import MODULES, scenarios
from chaos.result import Result, Scale

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("module", MODULES)
def test_scenario_keeps_its_invariants_at_ci_scale(module: str, tmp_path: Path) -> None:
    (scenario,) = [s for s in scenarios() if s.__name__ == f"chaos.{module}"]  # type: ignore[attr-defined]
    result = scenario.run(Scale.CI, tmp_path)
    assert result.failures == [], result.figures
    assert result.figures, "a scenario reports its figures"


def test_the_report_names_each_scenario_its_figures_and_what_broke(tmp_path: Path) -> None:
    broken = Result("partition", {"leaders_max": 2}, ["two leaders at once"])
    write(tmp_path, Scale.CI, [Result("replay", {"reruns": 0}), broken])
    (path,) = tmp_path.glob("*.json")
    document = json.loads(path.read_text())
    assert document["scale"] == "ci"
    assert document["scenarios"] == [
        {"name": "replay", "passed": True, "figures": {"reruns": 0}, "failures": []},
        {
            "name": "partition",
            "passed": False,
            "figures": {"leaders_max": 2},
            "failures": ["two leaders at once"],
        },
    ]
    assert "BROKEN: two leaders at once" in render(broken)
