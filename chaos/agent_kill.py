"""The agent SIGKILLed at random points while executions mixing `safe_to_retry` and
`at_most_once` tools run, then restarted; the ledger its step bodies write shows what ran twice.

Executions run in waves on `rebuno dev` (SQLite) and one agent process. Every program has one
crash point (seeded: an op, and before its call, in its body after the effect, after it returned
or during the report of its outcome); the first one reached kills the process, and every other
execution of the wave dies wherever it was. Once the kernel's view has settled, a snapshot
records which `at_most_once` steps were orphaned (`executing`, no outcome), then an agent is
started again (its instance announcement brings the redeliveries at once) and the wave runs to
its end.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.result import Figure, Result, Scale
from chaos.rig import CRASH_POINTS, TERMINAL, Bodies, Programs, Verdict, kernel_on, ms
from harness.ports import free_port

NAME = "agent_kill"
SUMMARY = "the agent SIGKILLed at random points over executions of safe and at-most-once tools"
SEED = 20260701


@dataclass(frozen=True, slots=True)
class Size:
    waves: int
    per_wave: int


SIZES = {
    Scale.CI: {"sqlite": Size(waves=2, per_wave=8)},
    Scale.FULL: {"sqlite": Size(waves=15, per_wave=20), "postgres": Size(waves=5, per_wave=20)},
}
"""The waves on each store: 300 executions on SQLite at full scale, and 100 on PostgreSQL."""


def program(rng: random.Random) -> dict[str, Any]:
    """Four to seven ops: tools of both idempotencies (sometimes identical calls) and local
    steps, and one crash point."""
    ops: list[dict[str, Any]] = []
    for _ in range(rng.randint(4, 7)):
        roll = rng.random()
        if roll < 0.8:
            ops.append(
                {
                    "t": "tool",
                    "name": rng.choice("ab"),
                    "once": roll < 0.4,
                    "arg": rng.randint(0, 2),
                }
            )
        else:
            ops.append({"t": "local", "arg": rng.randint(0, 9)})
    crash = {"op": rng.randrange(len(ops)), "at": rng.choice(CRASH_POINTS)}
    return {"ops": ops, "crash": [crash]}


@dataclass
class Tally:
    kills: int = 0
    interrupted: int = 0
    orphans: set[str] = field(default_factory=set)
    recovery: list[float] = field(default_factory=list)
    """Seconds from a kill to the handler running again (the agent's restart included)."""
    redelivery: list[float] = field(default_factory=list)
    """Seconds from the restarted agent listening to its handler running again."""
    fired: Counter[str] = field(default_factory=Counter)
    ids: list[str] = field(default_factory=list)
    bodies: Bodies = field(default_factory=Bodies)
    executions: list[dict[str, Any]] = field(default_factory=list)
    indeterminate: set[str] = field(default_factory=set)

    def read(self, rig: Programs) -> None:
        """What the kernel and the ledger hold at the end, read before the kernel stops."""
        self.bodies = Bodies.of(rig.ledger)
        for execution_id in self.ids:
            self.executions.append(rig.execution(execution_id))
            self.indeterminate |= {
                s["step_id"]
                for s in rig.steps(execution_id)
                if s["status"] == "failed"
                and (s.get("error") or {}).get("reason") == "indeterminate"
            }


def run(scale: Scale, workdir: Path) -> Result:
    result = Result(NAME)
    for store, size in SIZES[scale].items():
        folder = workdir / store
        folder.mkdir()
        prefix = "" if store == "sqlite" else f"{store}_"
        judge(on(store, size, folder), result, prefix)
    return result


def on(store: str, size: Size, workdir: Path) -> Tally:
    rng = random.Random(SEED)
    port = free_port()
    with kernel_on(store, workdir, f"http://127.0.0.1:{port}/webhook") as kernel:
        rig = Programs(workdir, kernel.url, port, jitter_ms=20, headers=kernel.headers)
        tally = Tally()
        try:
            for _ in range(size.waves):
                tally.ids += wave(rig, [program(rng) for _ in range(size.per_wave)], tally)
            tally.read(rig)
        finally:
            rig.close()
    return tally


def wave(rig: Programs, programs: list[dict[str, Any]], tally: Tally) -> list[str]:
    """Runs the programs through one kill and the recovery; their execution ids."""
    agent = rig.start_agent(armed=True)
    ids = [rig.create(p) for p in programs]
    deadline = time.monotonic() + 60
    while agent.alive() and rig.unfinished(ids) and time.monotonic() < deadline:
        time.sleep(0.02)
    if agent.alive():  # every program ended before any crash point fired
        agent.stop()
        return ids
    crash = [
        line for line in rig.ledger.lines() if line["ph"] == "crash" and line["pid"] == agent.pid
    ]
    in_flight = rig.unfinished(ids)
    steps = settled(rig, in_flight)
    tally.kills += 1
    tally.interrupted += len(in_flight)
    tally.fired.update(line["at"] for line in crash)
    tally.orphans |= {
        s["step_id"]
        for found in steps.values()
        for s in found
        if s["target"] == "chaos.once" and s["status"] == "executing"
    }
    restarted = rig.start_agent(armed=False)
    ready_at = time.time()
    rig.wait_finished(ids, 60)
    restarted.stop()
    killed_at = crash[0]["t"] if crash else ready_at
    tally.recovery += recovery(rig, in_flight, restarted.pid, killed_at)
    tally.redelivery += recovery(rig, in_flight, restarted.pid, ready_at)
    return ids


def settled(rig: Programs, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The steps of `ids` once two readings 100 ms apart agree: a request the dead agent sent
    may still be in the kernel's hands for a moment."""
    previous = {i: rig.steps(i) for i in ids}
    for _ in range(20):
        time.sleep(0.1)
        current = {i: rig.steps(i) for i in ids}
        if current == previous:
            break
        previous = current
    return previous


def recovery(rig: Programs, ids: list[str], pid: int, killed_at: float) -> list[float]:
    """Seconds from the kill to the restarted agent's handler taking up each execution."""
    first: dict[str, float] = {}
    for line in rig.ledger.lines():
        if line["ph"] == "handler" and line["pid"] == pid and line["e"] in ids:
            first.setdefault(line["e"], line["t"])
    return [t - killed_at for t in first.values()]


def judge(tally: Tally, result: Result, prefix: str) -> None:
    bodies = tally.bodies
    verdict = Verdict()
    unfinished = failed = 0
    for execution in tally.executions:
        if execution["status"] != "completed":
            failed += execution["status"] in TERMINAL
            unfinished += execution["status"] not in TERMINAL
            continue
        verdict += bodies.judge_output(execution["id"], execution["output"]["results"])
    duplicates = bodies.once_duplicates
    figures: dict[str, Figure] = {
        "executions": len(tally.ids),
        "kills": tally.kills,
        "interrupted": tally.interrupted,
        **{f"fired_{where}": tally.fired[where] for where in CRASH_POINTS},
        "body_runs": bodies.total,
        "safe_reruns": bodies.safe_reruns,
        "at_most_once_duplicates": duplicates,
        "completed_reruns": verdict.reruns,
        "misrouted": verdict.misrouted,
        "orphans": len(tally.orphans),
        "indeterminate": len(tally.indeterminate),
        "recovery_p50_ms": ms(tally.recovery, 50),
        "recovery_p99_ms": ms(tally.recovery, 99),
        "redelivery_p50_ms": ms(tally.redelivery, 50),
        "redelivery_p99_ms": ms(tally.redelivery, 99),
        "unfinished": unfinished,
        "failed": failed,
    }
    result.figures.update({prefix + key: value for key, value in figures.items()})
    where = f" ({prefix.rstrip('_')})" if prefix else ""
    result.expect(duplicates == 0, f"{duplicates} at_most_once effect(s) ran twice{where}")
    result.expect(
        verdict.reruns == 0, f"{verdict.reruns} body run(s) after a recorded outcome{where}"
    )
    result.expect(verdict.misrouted == 0, f"{verdict.misrouted} result(s) not their call's{where}")
    result.expect(
        tally.indeterminate == tally.orphans,
        f"{len(tally.indeterminate)} indeterminate steps, {len(tally.orphans)} orphaned "
        f"at_most_once{where}",
    )
    result.expect(
        unfinished == 0 and failed == 0, f"{unfinished} unfinished, {failed} failed{where}"
    )
    result.expect(tally.kills > 0, f"no crash point fired{where}")
