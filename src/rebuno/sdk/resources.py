"""`resource()` and `CheckpointPolicy`: external state (a sandbox, a database branch) an
execution uses, registered with the kernel, bound once to the provider's resource, and
captured at checkpoints a fork can start from (docs/protocol.md §33).

A driver is any object with a `driver_id`, optionally `configuration` and `coverage_reuse`,
and the methods `create(checkpoint_ref=None) -> (handle, binding)`, `open(binding) -> handle`
and `checkpoint(handle) -> ref` (needed only with a policy); each may be sync or async.
Imports only the SDK's own context and the models; never the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rebuno.sdk._context import execution


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a resource is captured: after every `every_steps` steps that affect it, and,
    with `on_completion`, once more before the execution completes if it is not covered.

    Args:
        every_steps: How many affecting steps between captures; at least 1.
        on_completion: Capture before completing when the last capture is stale.

    Example:
        sandbox = await rebuno.resource(
            "workspace", driver=SandboxDriver(), checkpoints=CheckpointPolicy(every_steps=2)
        )
    """

    every_steps: int = 1
    on_completion: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.every_steps, bool) or not isinstance(self.every_steps, int):
            raise ValueError("every_steps must be an integer")
        if self.every_steps < 1:
            raise ValueError("every_steps must be at least 1")


async def resource(key: str, *, driver: Any, checkpoints: CheckpointPolicy | None = None) -> Any:
    """Register the resource `key` with the current execution and return its handle.

    The first call in a delivery registers it with the kernel, then opens the provider's
    resource the kernel has a binding for, or creates one (from the checkpoint a fork
    restores, when there is one) and binds it; with a policy, a resource not covered by a
    checkpoint is captured at once as a baseline. Later calls in the same delivery return
    the same handle. While any resource is registered, tools and steps run one at a time,
    and a tool declares what it changes with `@tool(resources=[...])`.

    Args:
        key: The resource's name within the execution (`[A-Za-z0-9_.-]`, at most 128).
        driver: The provider's driver (see the module docstring).
        checkpoints: The capture policy; None for no checkpoints.

    Raises:
        CheckpointUnavailable: the driver cannot restore the selected checkpoint.
        ConflictError: `key` is registered with another driver or configuration.
        RuntimeError: called outside an execution.
    """
    return await execution().open_resource(key, driver, checkpoints)
