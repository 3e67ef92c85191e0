"""The benchmark suite runs end to end: a tiny run (`--quick`) on the embedded store produces
every scenario's figures and its JSON document. Nothing here judges the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.processes import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

FIGURES = (
    "A.latency_median",
    "A.span_marginal_per_step",
    "B.steps_per_s",
    "C.recovery",
    "D.kernel_peak_rss_mib",
    "E.replay_per_step_spread",
    "E.fresh_replay_per_step_spread",
    "F.dispatch_median",
)
DERIVED = ("A.step_in_reference", "A.span_marginal_scaled", "B.rate_in_reference")
BASELINES = ("floor.sqlite_commit", "reference.sqlite_step", "reference.sqlite_steps_per_s")


def test_quick_run_on_sqlite_reports_every_scenario(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "bench", "--quick", "--stores", "sqlite", "--out", str(tmp_path)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=280)

    assert done.returncode == 0, done.stdout + done.stderr
    [written] = tmp_path.glob("*.json")
    document = json.loads(written.read_text())
    figures = document["stores"]["sqlite"]["figures"]
    assert [key for key in FIGURES if figures.get(key, {}).get("median") is None] == []
    assert document["stores"]["sqlite"]["details"]["C.steps_before_crash_ran_once"] is True
    assert [key for key in DERIVED if figures.get(key, {}).get("median") is None] == []
    baselines = document["baselines"]
    assert [key for key in BASELINES if baselines.get(key, {}).get("median") is None] == []
    assert document["errors"] == {}
    assert "B steps/s" in done.stdout
