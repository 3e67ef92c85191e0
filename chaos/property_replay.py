"""Property-based replay: hypothesis draws agent programs of tool calls (both idempotencies),
LLM calls and local steps, with repeated identical calls and up to two crash points each; every
program runs as one execution through this SDK against `rebuno dev`, a dozen at a time, and its
crash points kill the agent process with SIGKILL, and with it every run of the batch wherever it
is (a new process is started each time, and the redeliveries resume the executions).

The property, per program: the execution completes; each op's result is its own; no body of a
step whose outcome was recorded runs again (the recorded run is the op's last, in the ledger
and at the stub model); no `at_most_once` effect happens twice. The draw is seeded and the
number of examples bounded; hypothesis draws the programs first (its shrinking phase is off,
since the runs happen in batches afterwards) and a program that breaks the property is
reported as drawn.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from chaos.result import Result, Scale
from chaos.rig import CRASH_POINTS, Bodies, ForkedAgent, Programs, dev_kernel, stub_model
from harness.llm_provider import FakeProvider
from harness.ports import free_port

NAME = "property_replay"
SUMMARY = "random programs of tool, LLM and local steps, crashed at random points, replayed"
SEED = 20260705
EXAMPLES = {Scale.CI: (10, 10), Scale.FULL: (120, 12)}
"""Programs drawn, and how many run at once."""
KILLS_PER_BATCH = 2
"""Crash points fire in the first processes of a batch only: a restart costs a process start,
and the runs each kill interrupts already land at random points."""

TOOLS = st.builds(
    lambda name, once, arg: {"t": "tool", "name": name, "once": once, "arg": arg},
    st.sampled_from("ab"),
    st.booleans(),
    st.integers(0, 1),
)
"""Two names and two arguments, so identical calls come up often."""
OPS = st.one_of(
    TOOLS,
    st.builds(lambda arg: {"t": "local", "arg": arg}, st.integers(0, 1)),
    st.just({"t": "llm"}),
)


@st.composite
def programs(draw: st.DrawFn) -> dict[str, Any]:
    ops = draw(st.lists(OPS, min_size=1, max_size=8))
    point = st.builds(
        lambda op, at: {"op": op, "at": at},
        st.integers(0, len(ops) - 1),
        st.sampled_from(CRASH_POINTS),
    )
    crash = draw(st.lists(point, max_size=2, unique_by=lambda p: (p["op"], p["at"])))
    return {"ops": ops, "crash": crash}


def draw(count: int) -> list[dict[str, Any]]:
    """`count` programs, as hypothesis draws them from `SEED`."""
    drawn: list[dict[str, Any]] = []

    @seed(SEED)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs())
    def collect(program: dict[str, Any]) -> None:
        drawn.append(program)

    collect()
    return drawn


@dataclass
class Replay:
    """Runs programs a batch at a time on one armed agent, restarted whenever it dies (a crash
    point of one program kills the runs of the others wherever they are)."""

    rig: Programs
    model: FakeProvider
    agent: ForkedAgent | None = None
    tally: Counter[str] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)

    def alive_agent(self, armed: bool) -> bool:
        """Starts an agent if none is running; whether it had to."""
        if self.agent is not None and self.agent.alive():
            return False
        self.tally["agent_starts"] += 1
        self.agent = self.rig.start_agent(armed=armed)
        return True

    def batch(self, programs: list[dict[str, Any]]) -> None:
        if self.agent is not None:  # a fresh, armed process for each batch
            self.agent.stop()
        self.alive_agent(armed=True)
        ids = [self.rig.create(program) for program in programs]
        deadline = time.monotonic() + 120
        kills = 0
        while self.rig.unfinished(ids) and time.monotonic() < deadline:
            kills += self.alive_agent(armed=kills + 1 < KILLS_PER_BATCH)
            time.sleep(0.01)
        bodies = Bodies.of(self.rig.ledger)
        for execution_id, program in zip(ids, programs, strict=True):
            self.check(execution_id, program, bodies)

    def check(self, execution_id: str, program: dict[str, Any], bodies: Bodies) -> None:
        """Records the property's breaches by one program's execution."""
        self.tally["examples"] += 1
        self.tally["ops"] += len(program["ops"])
        self.tally.update(f"ops_{op['t']}" for op in program["ops"])
        execution = self.rig.execution(execution_id)
        if execution["status"] != "completed":
            self.broken.append(f"{program} ended {execution['status']}")
            return
        results = execution["output"]["results"]
        verdict = bodies.judge_output(execution_id, results)
        duplicates = sum(n - 1 for (e, _), n in bodies.once.items() if e == execution_id and n > 1)
        llm_reruns = self.llm_reruns(execution_id, results)
        mine = [runs for key, runs in bodies.runs.items() if key[0] == execution_id]
        self.tally["body_runs"] += sum(len(runs) for runs in mine)
        self.tally["reruns_before_record"] += sum(len(runs) - 1 for runs in mine)
        self.tally["completed_reruns"] += verdict.reruns + llm_reruns
        self.tally["misrouted"] += verdict.misrouted
        self.tally["at_most_once_duplicates"] += duplicates
        self.tally["indeterminate"] += sum(1 for r in results if "error" in r)
        self.tally["denied"] += sum(1 for r in results if "denied" in r)
        if verdict.reruns + llm_reruns + verdict.misrouted + duplicates:
            self.broken.append(
                f"{program}: {verdict.reruns + llm_reruns} completed step(s) re-ran, "
                f"{verdict.misrouted} result(s) misrouted, {duplicates} at_most_once duplicate(s)"
            )

    def llm_reruns(self, execution_id: str, results: list[Any]) -> int:
        """Calls to the stub model after the one whose reply was recorded, over the ops."""
        calls: dict[str, list[int]] = {}
        for ordinal, request in enumerate(self.model.calls, start=1):
            calls.setdefault(request["messages"][-1]["content"], []).append(ordinal)
        reruns = 0
        for index, outcome in enumerate(results):
            if "reply" in outcome:
                ordinals = calls.get(f"{execution_id} {index}", [])
                self.tally["llm_calls"] += len(ordinals)
                later = [n for n in ordinals if n > outcome["reply"]]
                reruns += len(later) if outcome["reply"] in ordinals else 1
        return reruns


def run(scale: Scale, workdir: Path) -> Result:
    result = Result(NAME)
    count, size = EXAMPLES[scale]
    drawn = draw(count)
    port = free_port()
    kernel = dev_kernel(workdir, f"http://127.0.0.1:{port}/webhook")
    started = time.monotonic()
    with stub_model() as (model, url):
        rig = Programs(workdir, kernel.url, port, provider_url=url, jitter_ms=5)
        replay = Replay(rig, model)
        try:
            for first in range(0, len(drawn), size):
                replay.batch(drawn[first : first + size])
            crashes = sum(1 for line in rig.ledger.lines() if line["ph"] == "crash")
        finally:
            rig.close()
            kernel.stop()
    tally = replay.tally
    result.figures.update({key: tally[key] for key in FIGURES})
    result.figures["crashes"] = crashes
    result.figures["elapsed_s"] = round(time.monotonic() - started, 2)
    result.failures += replay.broken[:10]
    result.expect(len(drawn) >= count // 2, f"hypothesis drew only {len(drawn)} programs")
    result.expect(crashes > 0, "no crash point fired")
    return result


FIGURES = (
    "examples",
    "ops",
    "ops_tool",
    "ops_local",
    "ops_llm",
    "agent_starts",
    "body_runs",
    "llm_calls",
    "reruns_before_record",
    "completed_reruns",
    "misrouted",
    "at_most_once_duplicates",
    "indeterminate",
    "denied",
)
