"""What a replica remembers of the runs it follows stays bounded: by runs, by steps per run and
by step ids across all runs, the oldest forgotten first (`service/shortcuts.py`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service import shortcuts
from rebuno.kernel.service.shortcuts import Shortcuts
from rebuno.protocol.enums import StepStatus
from tests.store.builders import execution, step


def _followed(known: Shortcuts, steps: int) -> str:
    """A run followed from its claim, with `steps` steps committed here one at a time."""
    record = execution()
    lease = Lease(f"d-{record.id}", 1)
    known.claimed_first(lease, record, None)
    for n in range(steps):
        done = replace(step(record.id, n), status=StepStatus.SUCCEEDED)
        after = replace(record, last_event_seq=record.last_event_seq + 1)
        known.advanced(lease, record.last_event_seq, after, None, (), [done])
        record = after
    return record.id


def _held(known: Shortcuts, execution_id: str) -> bool:
    return known.run(execution_id, Lease(f"d-{execution_id}", 1)) is not None


def test_the_oldest_runs_go_once_the_step_ids_held_pass_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shortcuts, "STEPS_REMEMBERED", 10)
    known = Shortcuts()
    ids = [_followed(known, 4) for _ in range(4)]  # 16 ids: the first two runs go

    assert [_held(known, one) for one in ids] == [False, False, True, True]


def test_a_run_with_more_steps_than_a_run_may_hold_is_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shortcuts, "RUN_STEPS_REMEMBERED", 3)
    known = Shortcuts()

    assert _held(known, _followed(known, 3))
    assert not _held(known, _followed(known, 4))


def test_a_run_whose_record_moved_elsewhere_is_forgotten() -> None:
    known = Shortcuts()
    record = execution()
    lease = Lease("d-1", 1)
    known.claimed_first(lease, record, None)
    moved = replace(record, last_event_seq=record.last_event_seq + 5)

    known.advanced(lease, moved.last_event_seq - 1, moved, None, (), [])

    assert known.run(record.id, lease) is None


def test_a_disabled_replica_follows_nothing() -> None:
    known = Shortcuts(enabled=False)
    record = execution()
    known.claimed_first(Lease("d-1", 1), record, None)

    assert known.run(record.id, Lease("d-1", 1)) is None
