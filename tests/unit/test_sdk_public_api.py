"""Pins the SDK's public surface to the official SDK's documented one, so an agent written for
it runs here by changing nothing but the install. Extra optional parameters are ours."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import rebuno
import rebuno.mcp
import rebuno.types

EXPECTED_ALL = {
    "Agent",
    "Client",
    "tool",
    "wrap_tool",
    "step",
    "http_client",
    "RebunoTransport",
    "execution",
    "types",
    "RebunoError",
    "APIError",
    "PolicyError",
    "ToolError",
    "NetworkError",
    "NotFoundError",
    "ConflictError",
    "UnauthorizedError",
    "ForbiddenError",
    "ValidationError",
    "RateLimited",
    "Blocked",
    "Terminated",
    "LeaseSuperseded",
    "failure_reason",
    "raise_for_refusal",
    "Result",
    "previous",
    "subagent",
    "resource",
    "CheckpointPolicy",
    "CheckpointUnavailable",
}

SIGNATURES = {
    "Agent": "(agent_id, *, secret=None, base_url=None, webhook_path='/webhook', "
    "kernel_timeout=35.0, durability='durable', instance=None, check_kernel=None, "
    "description=None, output_schema=None)",
    "Agent.bind": "(self, process)",
    "Agent.publish_metadata": "(self)",
    "Agent.run": "(self, process, *, host='0.0.0.0', port=5000)",
    "Agent.join": "(self)",
    "Agent.close": "(self)",
    "Client": "(base_url=None, api_key=None, *, timeout=35.0)",
    "Client.close": "(self)",
    "Client.create": "(self, agent_id, input=None, *, session='', parent_execution_id='', "
    "idempotency_key='', spawned_by=None, on_behalf_of='')",
    "Client.fork": "(self, execution_id, *, at_seq, session='', policy_bundle='')",
    "subagent": "(agent_id, input=None, *, session='', client=None)",
    "previous": "()",
    "Client.get": "(self, execution_id)",
    "Client.cancel": "(self, execution_id)",
    "Client.events": "(self, execution_id, *, after_seq=0, limit=100)",
    "Client.list_steps": "(self, execution_id, *, status='')",
    "Client.get_step": "(self, execution_id, step_id)",
    "Client.get_approval": "(self, approval_id)",
    "tool": "(tool_id=None, *, idempotency='safe_to_retry', resources=None)",
    "wrap_tool": "(name, invoke, *, description='', args_schema=None, "
    "idempotency='safe_to_retry', to_result=None, transform_args=None, resources=None)",
    "step": "(name, fn, args=None, idempotency='safe_to_retry', resources=None)",
    "resource": "(key, *, driver, checkpoints=None)",
    "CheckpointPolicy": "(every_steps=1, on_completion=True)",
    "http_client": "(**kwargs)",
    "RebunoTransport": "(inner=None)",
    "RebunoTransport.handle_async_request": "(self, request)",
    "RebunoTransport.aclose": "(self)",
    "execution": "()",
    "APIError": "(message, code, status_code)",
    "PolicyError": "(message, rule_id='')",
    "ToolError": "(message, tool_id='', step_id='', retryable=False)",
    "RateLimited": "(reason='rate_limit_exceeded')",
    "Blocked": "()",
    "LeaseSuperseded": "(message='dispatch lease superseded', code='lease_superseded', "
    "status_code=409)",
    "failure_reason": "(exc)",
    "raise_for_refusal": "(exc)",
}

# Ours extends the documented ones with optional trailing keywords; the documented prefix holds.
EXTENDED = {
    "Client.list_approvals": ("(self, *, status='pending'", ["execution_id"]),
    "Client.grant_approval": ("(self, approval_id, *, decided_by", ["rationale"]),
    "Client.deny_approval": ("(self, approval_id, *, decided_by", ["rationale"]),
}

ASYNC = [
    "Agent.join",
    "Agent.publish_metadata",
    "Agent.close",
    "Client.create",
    "Client.get",
    "Client.cancel",
    "Client.events",
    "Client.list_steps",
    "Client.get_step",
    "Client.list_approvals",
    "Client.get_approval",
    "Client.grant_approval",
    "Client.deny_approval",
    "Client.close",
    "step",
    "resource",
    "RebunoTransport.handle_async_request",
]

ERROR_PARENTS = {
    "NetworkError": "RebunoError",
    "CheckpointUnavailable": "RebunoError",
    "APIError": "RebunoError",
    "ValidationError": "APIError",
    "UnauthorizedError": "APIError",
    "ForbiddenError": "APIError",
    "NotFoundError": "APIError",
    "ConflictError": "APIError",
    "PolicyError": "APIError",
    "LeaseSuperseded": "APIError",
    "ToolError": "RebunoError",
    "RateLimited": "RebunoError",
    "Blocked": "RebunoError",
    "Terminated": "RebunoError",
}

MODEL_FIELDS = {
    "Execution": {"id", "agent_id", "input", "status", "output", "failure_reason"},
    "Step": {
        "step_id",
        "execution_id",
        "kind",
        "target",
        "args_hash",
        "occurrence",
        "status",
        "idempotency",
        "args",
        "result",
        "error",
    },
    "StepDecision": {"decision", "step_id", "result", "error", "approval_id", "reason"},
    "Event": {"execution_id", "event_seq", "type", "payload", "occurred_at"},
    "Approval": {
        "id",
        "step_id",
        "execution_id",
        "status",
        "message",
        "decided_by",
        "rationale",
    },
}


def _resolve(dotted: str) -> Any:
    owner: Any = rebuno
    for part in dotted.split("."):
        owner = getattr(owner, part)
    return owner


def _shape(obj: Any) -> str:
    signature = inspect.signature(obj)
    bare = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def test_public_names_are_the_documented_ones() -> None:
    assert set(rebuno.__all__) == EXPECTED_ALL
    assert all(hasattr(rebuno, name) for name in rebuno.__all__)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_matches_documented_surface(name: str) -> None:
    assert _shape(_resolve(name)) == SIGNATURES[name]


@pytest.mark.parametrize("name", sorted(EXTENDED))
def test_extended_signature_keeps_documented_prefix(name: str) -> None:
    prefix, extras = EXTENDED[name]
    shape = _shape(_resolve(name))
    assert shape.startswith(prefix)
    assert list(inspect.signature(_resolve(name)).parameters)[-len(extras) :] == extras


@pytest.mark.parametrize("name", ASYNC)
def test_documented_coroutines_are_async(name: str) -> None:
    assert inspect.iscoroutinefunction(_resolve(name))


def test_client_is_an_async_context_manager() -> None:
    assert inspect.iscoroutinefunction(rebuno.Client.__aenter__)
    assert inspect.iscoroutinefunction(rebuno.Client.__aexit__)


def test_agent_app_is_a_property() -> None:
    assert isinstance(inspect.getattr_static(rebuno.Agent, "app"), property)


@pytest.mark.parametrize(("name", "parent"), sorted(ERROR_PARENTS.items()))
def test_error_tree_matches_documented_hierarchy(name: str, parent: str) -> None:
    assert getattr(rebuno, name).__bases__ == (getattr(rebuno, parent),)


@pytest.mark.parametrize(("model", "fields"), sorted(MODEL_FIELDS.items()))
def test_models_carry_documented_fields(model: str, fields: set[str]) -> None:
    assert fields <= set(getattr(rebuno.types, model).model_fields)


def test_execution_status_values_are_the_wire_strings() -> None:
    values = {status.value for status in rebuno.types.ExecutionStatus}
    assert values == {"pending", "running", "blocked", "completed", "failed", "cancelled"}


def test_mcp_wrappers_match_documented_signatures() -> None:
    expected = "(*, call, prefix='', idempotency='safe_to_retry', to_result=None)"
    assert _shape(rebuno.mcp.wrap_mcp_tool) == "(descriptor, " + expected[1:]
    assert _shape(rebuno.mcp.wrap_mcp_tools) == "(descriptors, " + expected[1:]
