"""The client side of the workload, through the SDK `Client` exactly as a user drives it:
create an execution, then `wait` for its terminal state. Sequentially (one at a time) or from
several concurrent clients.

Imports only the public SDK and the standard library.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bench.processes import AGENT_ID
from rebuno import Client


class ExecutionFailed(RuntimeError):
    """An execution of the workload did not complete: the figures would be meaningless."""


@dataclass(frozen=True, slots=True)
class Run:
    """One execution as the client saw it, and as the kernel recorded it.

    `latency` is from just before `create` to `wait` returning (seconds); `span` is the
    kernel's own record, from `created_at` to the terminal `updated_at` (seconds);
    `created_ns` is the monotonic clock just after `create` returned."""

    execution_id: str
    steps: int
    latency: float
    span: float
    created_ns: int


async def run_one(client: Client, steps: int, timeout: float) -> Run:
    """Create one execution of `steps` steps and wait until it is terminal."""
    started = time.perf_counter()
    execution = await client.create(AGENT_ID, input={"steps": steps})
    created_ns = time.monotonic_ns()
    done = await client.wait(execution.id, timeout=timeout)
    latency = time.perf_counter() - started
    if done.status != "completed":
        raise ExecutionFailed(f"execution {done.id} ended {done.status}: {done.failure_reason}")
    return Run(done.id, steps, latency, kernel_span(done.created_at, done.updated_at), created_ns)


def kernel_span(created_at: str, updated_at: str) -> float:
    """Seconds between two of the kernel's timestamps."""
    return (datetime.fromisoformat(updated_at) - datetime.fromisoformat(created_at)).total_seconds()


async def sequential(url: str, token: str, plan: Sequence[int], timeout: float) -> list[Run]:
    """One execution at a time, with `plan[i]` steps for the i-th."""
    async with Client(url, token) as client:
        return [await run_one(client, steps, timeout) for steps in plan]


async def concurrent(
    url: str, token: str, clients: int, count: int, steps: int, timeout: float
) -> tuple[list[Run], float]:
    """`count` executions shared among `clients` concurrent clients, each one at a time.
    Returns the runs and the wall time from the first create to the last completion."""
    runs: list[Run] = []
    left = count

    async def client_loop() -> None:
        nonlocal left
        async with Client(url, token) as client:
            while left > 0:
                left -= 1
                runs.append(await run_one(client, steps, timeout))

    started = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(clients)))
    return runs, time.perf_counter() - started
