"""The benchmark suite runs end to end: a tiny run (`--quick`) on the embedded store produces
every scenario's figures, A's and B's in each agent mode, and its JSON document. Nothing here
judges the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.processes import ROOT

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
MODE_FIGURES = (
    "A.{}.span_marginal_per_step",
    "A.{}.step_in_reference",
    "B.{}.steps_per_s",
    "B.{}.rate_in_reference",
    "D.{}.cpu_kernel_per_step",
)
MODE_ROWS = (
    "A per step, marginal span (target) [governed]",
    "A per step, marginal span [batched, not judged]",
    "B steps/s / bare reference steps/s (target) [governed]",
    "B steps/s [batched, not judged]",
    "D kernel CPU per step [batched, not judged]",
)
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
    in_modes = [key.format(mode) for key in MODE_FIGURES for mode in ("governed", "batched")]
    assert [key for key in in_modes if figures.get(key, {}).get("median") is None] == []
    assert "target" in figures["B.governed.steps_per_s"]
    assert "target" not in figures["B.batched.steps_per_s"]
    # The same-run ratios are judged on PostgreSQL, whose commits both baselines are.
    assert "target" not in figures["B.governed.rate_in_reference"]
    baselines = document["baselines"]
    assert [key for key in BASELINES if baselines.get(key, {}).get("median") is None] == []
    assert document["errors"] == {}
    assert "B steps/s" in done.stdout
    assert [row for row in MODE_ROWS if row not in done.stdout] == []
