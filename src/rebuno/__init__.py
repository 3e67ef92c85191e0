"""Rebuno: durable execution for AI agents. These are the SDK's public names.

Write an agent with `Agent`, `tool`, `wrap_tool`, `step` and `http_client` (a handler may
return a `Result` with the `state` the next execution reads through `previous`, and a tool
may run another agent with `subagent`, and external state is registered with `resource` and
captured under a `CheckpointPolicy`); drive
executions with `Client`. `rebuno.types` holds the models, `rebuno.mcp` the MCP tool wrappers.
"""

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
