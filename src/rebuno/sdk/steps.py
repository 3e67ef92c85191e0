"""`step()`: record local non-determinism (the clock, randomness, fresh ids) as a `local` step.

On a re-dispatch the recorded value comes back instead of a new one, so the effects that follow
see the same arguments and replay. Imports only the SDK's own context; never the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rebuno.protocol.enums import StepKind
from rebuno.sdk._context import execution
from rebuno.sdk.tools import _idempotency


async def step(
    name: str,
    fn: Callable[..., Any],
    args: dict[str, Any] | None = None,
    idempotency: str = "safe_to_retry",
    resources: list[str] | None = None,
) -> Any:
    """Run `fn(**args)` once per execution and replay its recorded result afterwards.

    Args:
        name: The step's target, which policy rules match on.
        fn: The work; sync or async, called as `fn(**args)`. Its result must be JSON.
        args: Keyword arguments for `fn`; part of the step's identity. Must be JSON.
        idempotency: `safe_to_retry` (default) or `at_most_once`.
        resources: The keys of the registered resources the step changes.

    Returns:
        `fn`'s result on the first run, the recorded result on every replay.

    Raises:
        PolicyError: the policy denied the step.
        ToolError: `fn` raised; the recorded failure is raised again on replay.
        TypeError: `args` is not JSON.
        RuntimeError: called outside an execution.

    Example:
        now = await step("now", time.time)
        pick = await step("pick", random.choice, args={"seq": ["a", "b"]})
    """
    mode = _idempotency(idempotency)
    context = execution()
    kwargs = dict(args or {})
    return await context.invoke_tool(
        name,
        kwargs,
        idempotency=mode.value,
        run=lambda: fn(**kwargs),
        kind=StepKind.LOCAL,
        resources=tuple(resources or ()),
    )
