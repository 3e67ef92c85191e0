"""The benchmark agent: one handler that runs `steps` sequential durable steps with `step()`.

Run as `python -m bench.agent`; configured by the environment: `REBUNO_URL`,
`REBUNO_AGENT_SECRET`, `BENCH_AGENT_ID`, `BENCH_PORT`, `BENCH_MARKS` (a JSON-lines file the
harness reads: the agent's start, webhook arrivals, step bodies, finished loops),
`BENCH_CRASH_AT` (the step whose body kills this process with SIGKILL),
`BENCH_DURABILITY` (passed to `Agent` as `durability=` unless empty: the default is left to the
SDK) and `BENCH_INSTANCE` (passed as `instance=` when this SDK's `Agent` accepts it).

The agent is served exactly as a user would serve it (`Agent.app` under uvicorn); the only
addition is a thin ASGI wrapper that notes when each webhook arrives. Imports only the public
SDK; never the kernel.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TextIO

import uvicorn

from rebuno import Agent, execution, step

Scope = MutableMapping[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]

PAYLOAD = "x" * 100
_EXECUTION_HEADER = b"rebuno-execution-id"


class Marks:
    """Appends one JSON object per line, flushed at once so a SIGKILL loses nothing."""

    def __init__(self, path: str) -> None:
        self._file: TextIO | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def write(self, **fields: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps(fields, separators=(",", ":")) + "\n")


MARKS = Marks(os.environ.get("BENCH_MARKS", ""))
CRASH_AT = int(os.environ.get("BENCH_CRASH_AT") or 0)


def payload(i: int, mark: bool = False) -> dict[str, Any]:
    """The body of step `i` (0-based); `mark` notes that it really ran."""
    if mark:
        MARKS.write(ev="step", execution_id=execution().id, i=i + 1)
        if i + 1 == CRASH_AT:
            os.kill(os.getpid(), signal.SIGKILL)
    return {"i": i, "payload": PAYLOAD}


async def work(
    steps: int, mark: bool = False, hold: bool = False, gate: bool = False
) -> dict[str, Any]:
    """Runs `steps` durable steps. With `hold` or `gate`, notes how long the loop took (a first
    run or a replay); then `hold` waits until the lease is lost, and `gate` runs local steps
    named `gate` (one per earlier round, then a new one) until one waits for an approval: E's
    agent has a policy that holds each for a person, so granting it re-dispatches the run."""
    started = time.perf_counter_ns()
    ends: list[int] = []
    last: Any = None
    for i in range(steps):
        last = await step("work", payload, args={"i": i, "mark": mark})
        ends.append(time.perf_counter_ns())
    if hold or gate:
        context = execution()
        MARKS.write(
            ev="loop",
            execution_id=context.id,
            attempt=context.dispatch_attempt,
            steps=steps,
            elapsed_ns=time.perf_counter_ns() - started,
            first_ns=ends[0] - started if ends else 0,
            tenths_ns=_tenths(started, ends),
        )
    if gate:
        for rounds in itertools.count():
            await step("gate", _nothing, args={"round": rounds})
    if hold:
        await asyncio.Event().wait()
    return {"steps": steps, "last": last}


def _nothing(**_: Any) -> None:
    return None


def _tenths(started: int, ends: list[int]) -> list[int]:
    """How long each tenth of the loop took, so a cost that grows with history shows."""
    if len(ends) < 10:
        return []
    bounds = [started] + [ends[len(ends) * k // 10 - 1] for k in range(1, 11)]
    return [later - earlier for earlier, later in itertools.pairwise(bounds)]


def noting_arrivals(app: App) -> App:
    """`app` behind a wrapper that notes the monotonic time each webhook POST arrives."""

    async def wrapped(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            arrived = time.monotonic_ns()
            headers = dict(scope.get("headers") or [])
            execution_id = headers.get(_EXECUTION_HEADER, b"").decode()
            MARKS.write(ev="arrive", execution_id=execution_id, t=arrived)
        await app(scope, receive, send)

    return wrapped


def build() -> Agent:
    """The agent as the environment asks for it; notes which options it was given."""
    options: dict[str, Any] = {}
    if durability := os.environ.get("BENCH_DURABILITY", ""):
        options["durability"] = durability
    instance = os.environ.get("BENCH_INSTANCE", "")
    # Not every version of the SDK has `instance=`: it is passed only when `Agent` takes it.
    if instance and "instance" in inspect.signature(Agent).parameters:
        options["instance"] = instance
    MARKS.write(ev="start", pid=os.getpid(), **options)
    return Agent(os.environ.get("BENCH_AGENT_ID", "bench"), **options)


def main() -> None:
    agent = build()
    agent.bind(work)
    port = int(os.environ["BENCH_PORT"])
    # As `Agent.run` does before serving (docs/sdk.md): E restarts this process for every
    # replay, and its first full collection would otherwise land in the replay's first steps.
    gc.collect()
    gc.freeze()
    uvicorn.run(
        noting_arrivals(agent.app),
        host="127.0.0.1",
        port=port,
        lifespan="on",
        interface="asgi3",
        log_level="warning",
    )


if __name__ == "__main__":
    main()
