"""`subagent()`: run another agent's execution as the outcome of the current step
(docs/protocol.md §25). The child is created through the bearer API, for the step whose body
is running; the execution then suspends until every child its steps wait for has ended, and
the rerun replays each step with its child's outcome."""

from __future__ import annotations

import os
from typing import Any

from rebuno.sdk._context import execution
from rebuno.sdk._submission import current_step
from rebuno.sdk.client import Client
from rebuno.types import SpawnedBy


async def subagent(
    agent_id: str, input: Any = None, *, session: str = "", client: Client | None = None
) -> Any:
    """Run `agent_id` on `input` as a sub-agent of the step whose body calls this, and
    return the child's output (a failed or cancelled child raises `ToolError`).

    While the child runs, the execution is blocked and its dispatch unwinds (the handler
    sees `Blocked` pass through); when the child ends, the handler runs again and the step
    replays the child's outcome without creating it again. The child is created with
    `client`, or with a `Client` for `REBUNO_URL` (default: the agent's kernel) and
    `REBUNO_API_KEY`; in server mode that key must be allowed to create executions.

    Raises:
        RuntimeError: outside the body of a `@tool`, `wrap_tool` or `step()` call.

    Example:
        @rebuno.tool
        async def research(topic: str) -> dict:
            return await rebuno.subagent("researcher", {"topic": topic})
    """
    context = execution()
    step_id = current_step()
    if step_id is None:
        raise RuntimeError(
            "subagent() must run inside a step body: a @tool, wrap_tool or step() call "
            "(with durability='batched', a safe step's body runs before it is recorded: "
            "mark it at_most_once)"
        )
    owned = client is None
    creator = client or Client(base_url=os.environ.get("REBUNO_URL") or context.kernel_url)
    try:
        spawned = SpawnedBy(execution_id=context.id, step_id=step_id)
        await creator.create(agent_id, input, session=session, spawned_by=spawned)
    finally:
        if owned:
            await creator.close()
    return await context.await_subagent(step_id)
