"""The checks the fault-injection scenarios judge by: an event log's faults, and what the
program agent's ledger says of an execution's output. Each is shown catching what it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.rig import Bodies, Ledger, LogFaults, log_faults


def _event(seq: int, kind: str, **payload: Any) -> dict[str, Any]:
    return {"event_seq": seq, "type": kind, "payload": payload}


def _clean_log() -> list[dict[str, Any]]:
    return [
        _event(1, "execution.created"),
        _event(2, "dispatch.queued", dispatch_id="d", attempt=0),
        _event(3, "dispatch.acked", dispatch_id="d", attempt=1),
        _event(4, "step.proposed", step_id="s"),
        _event(5, "step.executing", step_id="s"),
        _event(6, "step.succeeded", step_id="s"),
        _event(7, "dispatch.acked", dispatch_id="d", attempt=2),
        _event(8, "execution.completed"),
    ]


def test_a_clean_log_has_no_faults() -> None:
    assert log_faults(_clean_log()) == LogFaults()


def test_a_step_ended_twice_and_a_repeated_event_are_counted() -> None:
    log = [
        *_clean_log(),
        _event(9, "step.failed", step_id="s"),
        _event(10, "step.failed", step_id="s"),
    ]

    assert log_faults(log) == LogFaults(double_terminal=1, duplicates=1)


def test_a_gap_in_event_seq_is_counted() -> None:
    log = _clean_log()
    del log[3]

    assert log_faults(log).gaps == 1


def _ledger(tmp_path: Path, lines: list[dict[str, Any]]) -> Ledger:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return ledger


def _run(op: int, run: str, kind: str = "safe", effect: bool = True) -> list[dict[str, Any]]:
    start = {"ph": "start", "e": "x", "op": op, "run": run, "kind": kind}
    return [start, {**start, "ph": "effect"}] if effect else [start]


def test_a_body_run_after_the_recorded_one_is_a_rerun(tmp_path: Path) -> None:
    # Op 0 ran twice before its second run's result was recorded (a crash cut the first
    # short); op 1's result was recorded from its first run, and it ran once more.
    lines = _run(0, "a", effect=False) + _run(0, "b") + _run(1, "c") + _run(1, "d")
    bodies = Bodies.of(_ledger(tmp_path, lines))

    verdict = bodies.judge_output("x", [{"op": 0, "run": "b"}, {"op": 1, "run": "c"}])

    assert (verdict.reruns, verdict.misrouted) == (1, 0)
    assert bodies.safe_reruns == 2


def test_a_result_of_another_call_is_misrouted(tmp_path: Path) -> None:
    bodies = Bodies.of(_ledger(tmp_path, _run(0, "a") + _run(1, "b")))

    verdict = bodies.judge_output("x", [{"op": 0, "run": "b"}, {"op": 0, "run": "a"}])

    assert verdict.misrouted == 2


def test_an_at_most_once_effect_twice_is_a_duplicate(tmp_path: Path) -> None:
    bodies = Bodies.of(_ledger(tmp_path, _run(0, "a", "once") + _run(0, "b", "once")))

    assert bodies.once_duplicates == 1
