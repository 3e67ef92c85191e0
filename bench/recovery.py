"""The scenarios that re-dispatch an execution on purpose: C (recovery after a SIGKILL inside a
step, with a short lease, `sizes.lease_seconds`, so the execution of a dead agent is
redelivered quickly) and E (the cost of replaying a recorded history, by size, each replay
started by granting an approval, in the same agent process or in a new one).

Imports only the bench's own modules, the public SDK and the standard library.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime
from typing import Any

from bench.outcome import Context, Outcome
from bench.processes import AGENT_ID, AgentOptions, poll
from bench.rig import Rig, rig
from bench.scenarios import warm_up
from bench.sizes import Sizes
from bench.stats import median
from bench.workload import ExecutionFailed
from rebuno import Client


def _kernel_env(ctx: Context) -> dict[str, str]:
    return {
        "REBUNO_DISPATCH_LEASE_TIMEOUT": f"{ctx.sizes.lease_seconds}s",
        "REBUNO_DISPATCH_MAX_ATTEMPTS": "5",
    }


C_INSTANCE = "bench-c"
"""C's agent's stable instance name, passed when the SDK's `Agent` takes `instance=`: a
restarted agent that announces it lets the kernel redeliver at once, not after the lease."""


def recovery(ctx: Context) -> Outcome:
    """C: the agent, the default `Agent` running plain `step()` calls, SIGKILLs itself inside
    step `c_crash_at`; a new agent is started at once. The figure is from that restart to the
    kernel recording the execution completed."""
    sizes, outcome = ctx.sizes, Outcome()
    options = AgentOptions(instance=C_INSTANCE)
    with rig(ctx.store, ctx.workdir / "C", _kernel_env(ctx), sizes, options=options) as current:
        reps = [_recovery_rep(current, ctx) for _ in range(sizes.reps)]
    outcome.add_from(reps, {"recovery": "s", "recovery_seen_by_client": "s"}, "C")
    outcome.details["C.lease_s"] = sizes.lease_seconds
    outcome.details["C.agent_instance"] = reps[-1]["instance"] or "none (Agent takes no instance=)"
    outcome.details["C.steps_before_crash_ran_once"] = all(rep["verified"] for rep in reps)
    outcome.details["C.step_runs"] = [rep["runs"] for rep in reps]
    return outcome


def _recovery_rep(current: Rig, ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    current.agent.stop()
    current.start_agent(crash_at=sizes.c_crash_at).wait_listening()
    current.new_marks()
    execution_id = asyncio.run(_create(current, {"steps": sizes.c_steps, "mark": True}))
    poll(lambda: not current.agent.alive(), 60, f"the agent to crash\n{current.logs()}")
    restarted_wall, restarted = time.time(), time.perf_counter()
    current.start_agent()
    done = asyncio.run(_wait(current, execution_id, sizes.wait_timeout))
    seen = time.perf_counter() - restarted
    completed = datetime.fromisoformat(done["updated_at"]).timestamp()
    marks = current.new_marks()
    runs = Counter(
        mark["i"] for mark in marks if mark["ev"] == "step" and mark["execution_id"] == execution_id
    )
    # Every step before the crash ran once; the one cut short by it may run again.
    before = range(1, sizes.c_crash_at)
    started = [mark for mark in marks if mark["ev"] == "start"]
    return {
        "recovery": completed - restarted_wall,
        "recovery_seen_by_client": seen,
        "verified": all(runs[i] == 1 for i in before) and len(runs) == sizes.c_steps,
        "runs": {str(i): runs[i] for i in sorted(runs)},
        "instance": started[-1].get("instance", "") if started else "",
    }


async def _create(current: Rig, input: dict[str, Any]) -> str:
    async with Client(current.kernel.url, current.token) as client:
        execution = await client.create(AGENT_ID, input=input)
        return execution.id


async def _wait(current: Rig, execution_id: str, timeout: float) -> dict[str, Any]:
    async with Client(current.kernel.url, current.token) as client:
        done = await client.wait(execution_id, timeout=timeout)
    if done.status != "completed":
        raise ExecutionFailed(f"execution {done.id} ended {done.status}: {done.failure_reason}")
    return {"updated_at": done.updated_at}


async def _cancel(current: Rig, execution_id: str) -> None:
    async with Client(current.kernel.url, current.token) as client:
        await client.cancel(execution_id)


GATE_POLICY = """\
rules:
  - id: gate
    when: {step_kind: local, target: gate}
    then: {decision: require_approval}
default_action: allow
"""
"""E's agent: every step is allowed, but each `gate` step waits for a person."""
WARM, FRESH = "replay", "fresh_replay"
"""E's two ways into a replay: granting the approval to the agent process that asked for it,
or to a new one started just before (the old one killed)."""


def replay_cost(ctx: Context) -> Outcome:
    """E: record a history of n steps that ends at a step waiting for an approval; each grant
    re-dispatches the execution, and the agent replays the whole history and stops at the
    next such step. Replays alternate between the agent process that recorded (or last
    replayed) the history and a new process started just before the grant.

    Besides the whole replay divided by n, the first replayed step and the mean of the others
    are reported apart: a fixed cost at the start of a replay shows there, not as a slope."""
    sizes, outcome = ctx.sizes, Outcome()
    replays: dict[str, dict[int, list[dict[str, float]]]] = {WARM: {}, FRESH: {}}
    tenths: dict[str, list[float]] = {}
    outcome.details["E.per_step_us_by_tenth"] = tenths
    with rig(ctx.store, ctx.workdir / "E", {}, sizes, policy=GATE_POLICY) as current:
        warm_up(current, ctx, sizes.a_steps)
        # Unmeasured: the warm-up executions never replay a step. PostgreSQL plans a
        # statement afresh for its first five runs in each backend (then it keeps a generic
        # plan); the pool hands out the connection returned last, so the measured replays run
        # on a backend past that.
        _history(current, ctx, sizes.a_steps, {}, reps=3, per_rep=1)
        for steps in sizes.e_histories:
            per_rep = _replays_per_rep(sizes.e_min_replayed_steps, steps)
            recorded, by_way = _history(current, ctx, steps, tenths, sizes.reps, per_rep)
            outcome.add(f"E.record_per_step_{steps}", "us", [recorded])
            units = {"per_step": "us", "first_step": "ms", "rest_per_step": "us", "wait": "s"}
            for way, reps in by_way.items():
                replays[way][steps] = reps
                for key, unit in units.items():
                    outcome.add(f"E.{way}_{key}_{steps}", unit, [rep[key] for rep in reps])
    for way, by_size in replays.items():
        for key in ("per_step", "rest_per_step"):
            spreads = [
                _spread([by_size[n][rep][key] for n in by_size]) for rep in range(sizes.reps)
            ]
            outcome.add(f"E.{way}_{key}_spread", "%", spreads)
    return outcome


def _replays_per_rep(min_steps: int, steps: int) -> int:
    """Replays of a history of `steps` each way in one repetition: enough to replay
    `min_steps`. A replay of ten steps lasts about 6 ms, and one burst of other work on the
    machine would otherwise decide its figure."""
    return max(1, -(-min_steps // steps))


def _history(
    current: Rig,
    ctx: Context,
    steps: int,
    tenths: dict[str, list[float]],
    reps: int,
    per_rep: int,
) -> tuple[float, dict[str, list[dict[str, float]]]]:
    """Per-step microseconds of the first run, and each way's figures in each of `reps`
    repetitions, each the medians of its `per_rep` replays; each loop's per-step cost by
    tenths goes into `tenths`."""
    sizes = ctx.sizes
    current.new_marks()
    execution_id = asyncio.run(_create(current, {"steps": steps, "gate": True}))
    first = _next_loop(current, execution_id, sizes.wait_timeout + steps * 0.05)
    tenths[f"first_run_{steps}"] = _per_step_tenths(first)
    by_way: dict[str, list[dict[str, float]]] = {WARM: [], FRESH: []}
    for rep in range(reps):
        figures: dict[str, list[dict[str, float]]] = {WARM: [], FRESH: []}
        for again in range(per_rep):
            for way in (WARM, FRESH):
                # The run stops at its next gate; its approval is what the grant answers.
                approval = asyncio.run(_pending_approval(current, execution_id, sizes))
                if way == FRESH:
                    current.agent.kill()
                    current.start_agent().wait_listening()
                granted = time.perf_counter()
                asyncio.run(_grant(current, approval))
                loop = _next_loop(current, execution_id, sizes.wait_timeout + steps * 0.01)
                figures[way].append(_replay_figures(loop, time.perf_counter() - granted))
                tenths[f"{way}_{rep * per_rep + again + 1}_{steps}"] = _per_step_tenths(loop)
        for way, found in figures.items():
            by_way[way].append({key: median([f[key] for f in found]) for key in found[0]})
    asyncio.run(_cancel(current, execution_id))
    return first["elapsed_ns"] / 1000 / steps, by_way


async def _pending_approval(current: Rig, execution_id: str, sizes: Sizes) -> str:
    """The id of the execution's pending approval, once there is one: the run asks for it
    when it reaches its next gate, after every step before it was recorded."""
    deadline = time.monotonic() + sizes.wait_timeout
    async with Client(current.kernel.url, current.token) as client:
        while not (pending := await client.list_approvals(execution_id=execution_id)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution {execution_id}: no approval asked for")
            ended = await client.get(execution_id)
            if ended.status.is_terminal:
                raise ExecutionFailed(
                    f"execution {execution_id} ended {ended.status}: {ended.failure_reason}"
                )
            await asyncio.sleep(0.005)
    return pending[0].id


async def _grant(current: Rig, approval_id: str) -> None:
    async with Client(current.kernel.url, current.token) as client:
        await client.grant_approval(approval_id, decided_by="bench")


def _per_step_tenths(loop: dict[str, Any]) -> list[float]:
    """Microseconds per step in each tenth of a loop, first tenth first."""
    share = loop["steps"] / 10
    return [round(tenth / 1000 / share, 1) for tenth in loop.get("tenths_ns", [])]


def _replay_figures(loop: dict[str, Any], wait: float) -> dict[str, float]:
    steps, elapsed, first = loop["steps"], loop["elapsed_ns"], loop["first_ns"]
    return {
        "per_step": elapsed / 1000 / steps,
        "first_step": first / 1e6,
        "rest_per_step": (elapsed - first) / 1000 / max(steps - 1, 1),
        "wait": wait,
    }


def _next_loop(current: Rig, execution_id: str, timeout: float) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def finished() -> bool:
        found.extend(
            mark
            for mark in current.new_marks()
            if mark["ev"] == "loop" and mark["execution_id"] == execution_id
        )
        if not current.agent.alive():
            raise RuntimeError(f"the agent died:\n{current.logs()}")
        return bool(found)

    poll(finished, timeout, f"execution {execution_id} to finish its loop", interval=0.01)
    return found[0]


def _spread(values: list[float]) -> float:
    """How far apart the per-step figures are: (max - min) / min, in percent."""
    return (max(values) - min(values)) / min(values) * 100
