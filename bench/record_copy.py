"""What copying a record costs: `rebuno.kernel.domain.records.replace` against the standard
library's `dataclasses.replace`, for the records a step submission copies (an execution moving
its `last_event_seq`, a step taking its outcome, a submission's plan taking its counters).

Both make the same copy; the figure is nanoseconds per copy, the best of several rounds (the
least disturbed by other work on the machine), and the ratio between them. A submission makes
some six to eight such copies.

`python -m bench.record_copy [--copies N] [--rounds R]`

Imports the kernel's records and the decision core's plan; nothing that does I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
import timeit
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from rebuno.kernel.decision.submission import Plan
from rebuno.kernel.domain.decision import StepDecision
from rebuno.kernel.domain.records import Execution, Origin, Step, replace
from rebuno.protocol.enums import (
    Decision,
    ExecutionStatus,
    Idempotency,
    StepKind,
    StepStatus,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _records() -> list[tuple[str, Any, dict[str, Any]]]:
    execution = Execution(
        "e", "agent", Origin(None, "{}", NOW, None), ExecutionStatus.RUNNING, None, None, NOW, 3
    )
    step = Step(
        "s", "e", StepKind.TOOL_CALL, "t", "h", 0, StepStatus.EXECUTING,
        Idempotency.SAFE_TO_RETRY, "{}", None, None, None, None, 1, NOW, None,
    )  # fmt: skip
    plan = Plan(StepDecision(Decision.PROCEED, "s"), execution, insert_step=step)
    return [
        ("execution", execution, {"last_event_seq": 4}),
        ("step", step, {"status": StepStatus.SUCCEEDED, "result": "1"}),
        ("plan", plan, {"advance_occurrence": True, "renew_lease": False}),
    ]


def _per_copy(copy: Callable[[], object], copies: int, rounds: int) -> float:
    """Nanoseconds per copy, the best of `rounds`."""
    return min(timeit.repeat(copy, number=copies, repeat=rounds)) / copies * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.record_copy")
    parser.add_argument("--copies", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{'record':<10} {'records.replace':>16} {'dataclasses.replace':>20} {'ratio':>6}")
    for name, record, changes in _records():
        ours = _per_copy(partial(replace, record, **changes), args.copies, args.rounds)
        standard = partial(dataclasses.replace, record, **changes)
        theirs = _per_copy(standard, args.copies, args.rounds)
        print(f"{name:<10} {ours:>13.0f} ns {theirs:>17.0f} ns {theirs / ours:>6.2f}")


if __name__ == "__main__":
    main()
