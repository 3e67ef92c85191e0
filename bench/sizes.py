"""The knobs of a benchmark run: the full workload `make bench` runs, and the tiny one
`BENCH_QUICK=1` runs. Standard library only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each scenario does. `lease_seconds` is the kernel's lease in C, so a
    killed agent's execution is redelivered quickly; the others run with the default.

    B's 1,000 executions are spread over its repetitions (334 each), so that a full run on
    both stores fits in ten minutes on a 2-core machine; `--set b_executions=1000` runs
    1,000 in each repetition.

    E replays each history, each of its two ways, until it has replayed
    `e_min_replayed_steps` steps in a repetition (three replays of 10 steps, one of 1,000)
    and keeps the medians.

    A and B, with D, run in each agent mode (bench/modes.py); the modes beside the headline
    repeat `mode_reps` times (at most `reps`).

    The bare reference times `ref_steps` steps of one client, then `ref_rate_steps` steps of
    B's clients at once: long enough (about a second) that a stall of the shared machine
    does not decide its rate.

    `pg_workers` runs the PostgreSQL kernel as `rebuno server --workers N` (D then sums the
    supervisor and its workers). `step_records=0` runs the kernel with
    `REBUNO_STEP_RECORDS=false`, so every step is submitted before it runs, even in the
    `batched` mode."""

    reps: int = 3
    mode_reps: int = 3
    warmup: int = 10
    a_executions: int = 200
    a_empty_executions: int = 40
    a_steps: int = 10
    b_executions: int = 334
    b_clients: int = 16
    b_steps: int = 10
    c_steps: int = 50
    c_crash_at: int = 26
    e_histories: tuple[int, ...] = (10, 1000, 10000)
    e_min_replayed_steps: int = 30
    floor_commits: int = 500
    ref_steps: int = 500
    ref_rate_steps: int = 3000
    lease_seconds: int = 2
    wait_timeout: float = 120.0
    pg_workers: int = 1
    step_records: int = 1

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


FULL = Sizes()

QUICK = Sizes(
    reps=1,
    warmup=2,
    a_executions=6,
    a_empty_executions=2,
    b_executions=24,
    b_clients=4,
    c_steps=6,
    c_crash_at=4,
    e_histories=(5, 20),
    e_min_replayed_steps=1,
    floor_commits=20,
    ref_steps=20,
    ref_rate_steps=40,
)
