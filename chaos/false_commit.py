"""Commits that succeed but report failure: the kernel runs on a store wrapper that, at a set
rate, lets a transaction (or a dispatch claim) commit and then raises the store's
`Unavailable`, as a connection lost between the commit and its answer would.

The kernel is served in this process on that store (SQLite) and real program agents run against
it. A use case whose commit "failed" answers 500 though its writes are in; the agent gives the
run up and the lease brings it back, so the next attempt finds what the lost answer would have
told it. The event log must show each write once.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import httpx

from chaos.result import Result, Scale
from chaos.rig import (
    AGENT_ID,
    TERMINAL,
    Bodies,
    InProcessKernel,
    LogFaults,
    Programs,
    Verdict,
    fast_settings,
    log_faults,
    sqlite_store,
)
from harness.ports import free_port
from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.store.base import ClaimedDispatch, Store, Transaction, Unchanged

NAME = "false_commit"
SUMMARY = "commits that succeed but report failure, at a set rate"
SEED = 20260702
SIZES = {Scale.CI: (12, 0.08), Scale.FULL: (120, 0.05)}
"""Executions, and the share of commits whose answer is lost."""


class FalseCommits:
    """Delegates everything to `inner`. While `armed`, each transaction that commits and each
    dispatch claim raises `Unavailable` afterwards with probability `rate`."""

    def __init__(self, inner: Store, rate: float, seed: int) -> None:
        self.inner = inner
        self.rate = rate
        self.armed = False
        self.commits = 0
        self.injected = 0
        self._rng = random.Random(seed)

    def _lose_answer(self) -> None:
        self.commits += 1
        if self.armed and self._rng.random() < self.rate:
            self.injected += 1
            raise Unavailable("injected fault: the commit succeeded, its answer was lost")

    @asynccontextmanager
    async def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AsyncIterator[Transaction]:
        async with self.inner.transaction(execution_id, unchanged) as tx:
            yield tx
        self._lose_answer()

    async def claim_dispatches(
        self, replica_id: str, limit: int, now: datetime
    ) -> list[ClaimedDispatch]:
        claimed = await self.inner.claim_dispatches(replica_id, limit, now)
        if claimed:
            self._lose_answer()
        return claimed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def program(rng: random.Random) -> dict[str, Any]:
    ops: list[dict[str, Any]] = []
    for _ in range(rng.randint(3, 6)):
        roll = rng.random()
        if roll < 0.8:
            once = roll < 0.35
            ops.append(
                {"t": "tool", "name": rng.choice("ab"), "once": once, "arg": rng.randint(0, 3)}
            )
        else:
            ops.append({"t": "local", "arg": rng.randint(0, 9)})
    return {"ops": ops}


def run(scale: Scale, workdir: Path) -> Result:
    count, rate = SIZES[scale]
    rng = random.Random(SEED)
    port = free_port()
    wrapper = FalseCommits(sqlite_store(workdir), rate, SEED)
    settings = fast_settings(workdir, f"http://127.0.0.1:{port}/webhook")
    kernel = InProcessKernel(settings, store=cast(Store, wrapper))
    rig = Programs(workdir, kernel.url, port)
    try:
        wrapper.armed = True
        rig.start_agent()
        started = time.monotonic()
        unanswered = sum(not created(rig, program(rng)) for _ in range(count))
        # A create whose answer was lost made its execution all the same: the agent's list
        # holds every execution, whether its creator learnt the id or not.
        ids = listed(rig)
        left = rig.wait_finished(ids, 120)
        elapsed = time.monotonic() - started
        wrapper.armed = False
        result = judge(rig, ids, left, wrapper, elapsed)
        result.figures["creates_unanswered"] = unanswered
        result.expect(len(ids) == count, f"{len(ids)} executions for {count} creates")
        return result
    finally:
        rig.close()
        kernel.stop()


def created(rig: Programs, program: dict[str, Any]) -> bool:
    """Creates an execution of `program`; False when the kernel answered 500."""
    try:
        rig.create(program)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 500:
            raise
        return False
    return True


def listed(rig: Programs) -> list[str]:
    """Every execution of the program agent, paging through the list."""
    ids: list[str] = []
    cursor = ""
    while True:
        query = f"agent_id={AGENT_ID}&limit=200" + (f"&cursor={cursor}" if cursor else "")
        response = rig.http.get(f"/v0/executions?{query}")
        response.raise_for_status()
        page = response.json()
        ids += [execution["id"] for execution in page["executions"]]
        cursor = page.get("next_cursor") or ""
        if not cursor:
            return ids


def judge(
    rig: Programs, ids: list[str], left: list[str], wrapper: FalseCommits, elapsed: float
) -> Result:
    result = Result(NAME)
    faults = LogFaults()
    attempts: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    indeterminate = 0
    bodies = Bodies.of(rig.ledger)
    verdict = Verdict()
    for execution_id in ids:
        events = rig.events(execution_id)
        faults += log_faults(events)
        attempts[sum(1 for e in events if e["type"] == "dispatch.acked")] += 1
        execution = rig.execution(execution_id)
        statuses[execution["status"]] += 1
        if execution["status"] == "completed":
            verdict += bodies.judge_output(execution_id, execution["output"]["results"])
        indeterminate += sum(
            1
            for s in rig.steps(execution_id)
            if (s.get("error") or {}).get("reason") == "indeterminate"
        )
    duplicates = bodies.once_duplicates
    result.figures.update(
        executions=len(ids),
        fault_rate=wrapper.rate,
        commits=wrapper.commits,
        false_commits=wrapper.injected,
        redelivered_executions=sum(n for acked, n in attempts.items() if acked > 1),
        deliveries_max=max(attempts, default=0),
        completed=statuses["completed"],
        unfinished=len(left),
        indeterminate=indeterminate,
        double_terminal=faults.double_terminal,
        duplicate_events=faults.duplicates,
        seq_gaps=faults.gaps,
        at_most_once_duplicates=duplicates,
        completed_reruns=verdict.reruns,
        misrouted=verdict.misrouted,
        elapsed_s=round(elapsed, 2),
    )
    result.expect(faults.double_terminal == 0, f"{faults.double_terminal} step(s) ended twice")
    result.expect(faults.duplicates == 0, f"{faults.duplicates} duplicated event(s)")
    result.expect(faults.gaps == 0, f"{faults.gaps} log(s) with a gap in event_seq")
    result.expect(duplicates == 0, f"{duplicates} at_most_once effect(s) ran twice")
    result.expect(verdict.reruns == 0, f"{verdict.reruns} body run(s) after a recorded outcome")
    result.expect(verdict.misrouted == 0, f"{verdict.misrouted} result(s) not their call's")
    result.expect(not left, f"{len(left)} execution(s) never ended")
    result.expect(
        sum(statuses[s] for s in TERMINAL) == statuses["completed"],
        f"executions ended otherwise than completed: {dict(statuses)}",
    )
    result.expect(wrapper.injected > 0, "no fault was injected")
    return result
