"""Rebuno: durable execution for AI agents. These are the SDK's public names.

Write an agent with `Agent`, `tool`, `wrap_tool`, `step` and `http_client` (a handler may
return a `Result` with the `state` the next execution reads through `previous`, and a tool
may run another agent with `subagent`, and external state is registered with `resource` and
captured under a `CheckpointPolicy`); drive
executions with `Client`. `rebuno.types` holds the models, `rebuno.mcp` the MCP tool wrappers.

The names are imported on first use (PEP 562), so a program that needs only part of the
package (the `rebuno` command, which starts in a fraction of the time) does not pay for the
rest; a type checker reads the imports below as they are written.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebuno import types
    from rebuno.sdk._context import Result, execution, previous
    from rebuno.sdk.agent import Agent
    from rebuno.sdk.client import Client
    from rebuno.sdk.errors import (
        APIError,
        Blocked,
        CheckpointUnavailable,
        ConflictError,
        ForbiddenError,
        LeaseSuperseded,
        NetworkError,
        NotFoundError,
        PolicyError,
        RateLimited,
        RebunoError,
        Terminated,
        ToolError,
        UnauthorizedError,
        ValidationError,
        failure_reason,
        raise_for_refusal,
    )
    from rebuno.sdk.llm import RebunoTransport, http_client
    from rebuno.sdk.resources import CheckpointPolicy, resource
    from rebuno.sdk.steps import step
    from rebuno.sdk.subagent import subagent
    from rebuno.sdk.tools import tool, wrap_tool

_HOMES = {
    "types": "rebuno",
    "Result": "rebuno.sdk._context",
    "execution": "rebuno.sdk._context",
    "previous": "rebuno.sdk._context",
    "Agent": "rebuno.sdk.agent",
    "Client": "rebuno.sdk.client",
    "APIError": "rebuno.sdk.errors",
    "Blocked": "rebuno.sdk.errors",
    "CheckpointUnavailable": "rebuno.sdk.errors",
    "ConflictError": "rebuno.sdk.errors",
    "ForbiddenError": "rebuno.sdk.errors",
    "LeaseSuperseded": "rebuno.sdk.errors",
    "NetworkError": "rebuno.sdk.errors",
    "NotFoundError": "rebuno.sdk.errors",
    "PolicyError": "rebuno.sdk.errors",
    "RateLimited": "rebuno.sdk.errors",
    "RebunoError": "rebuno.sdk.errors",
    "Terminated": "rebuno.sdk.errors",
    "ToolError": "rebuno.sdk.errors",
    "UnauthorizedError": "rebuno.sdk.errors",
    "ValidationError": "rebuno.sdk.errors",
    "failure_reason": "rebuno.sdk.errors",
    "raise_for_refusal": "rebuno.sdk.errors",
    "RebunoTransport": "rebuno.sdk.llm",
    "http_client": "rebuno.sdk.llm",
    "CheckpointPolicy": "rebuno.sdk.resources",
    "resource": "rebuno.sdk.resources",
    "step": "rebuno.sdk.steps",
    "subagent": "rebuno.sdk.subagent",
    "tool": "rebuno.sdk.tools",
    "wrap_tool": "rebuno.sdk.tools",
}
"""Where each public name lives."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rebuno' has no attribute {name!r}")
    module = import_module(f"{home}.{name}" if name == "types" else home)
    value = module if name == "types" else getattr(module, name)
    globals()[name] = value  # found directly from now on
    return value


__all__ = [
    "APIError",
    "Agent",
    "Blocked",
    "CheckpointPolicy",
    "CheckpointUnavailable",
    "Client",
    "ConflictError",
    "ForbiddenError",
    "LeaseSuperseded",
    "NetworkError",
    "NotFoundError",
    "PolicyError",
    "RateLimited",
    "RebunoError",
    "RebunoTransport",
    "Result",
    "Terminated",
    "ToolError",
    "UnauthorizedError",
    "ValidationError",
    "execution",
    "failure_reason",
    "http_client",
    "previous",
    "raise_for_refusal",
    "resource",
    "step",
    "subagent",
    "tool",
    "types",
    "wrap_tool",
]
