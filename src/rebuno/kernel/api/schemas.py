"""Records to JSON (§4): empty optional fields omitted, raw JSON embedded without re-parsing.

JSON values the store keeps as text (`input`, `args`, `result`, event payloads, ...) go out
through `orjson.Fragment`, so their number literals are never rounded. Lists are always
arrays. Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from starlette.responses import Response

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.decision import StepDecision
from rebuno.kernel.domain.execution import spawned_by
from rebuno.kernel.domain.records import (
    Agent,
    Approval,
    Checkpoint,
    Event,
    Execution,
    RawJson,
    Resource,
    Step,
)
from rebuno.kernel.store.base import Omitted, Page
from rebuno.protocol.times import format_timestamp

JSON_MEDIA_TYPE = "application/json; charset=utf-8"


def json_response(content: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type=JSON_MEDIA_TYPE)


def no_content() -> Response:
    return Response(status_code=204)


def _set(target: dict[str, Any], key: str, value: object) -> None:
    """Adds `key` unless the value is empty: the §4 *omit* rule."""
    if value is not None and value != "":
        target[key] = value


def _raw(text: str | None) -> orjson.Fragment | None:
    return None if text is None else orjson.Fragment(text)


def _number(value: float) -> float | int:
    """Whole numbers are written without a fraction (`600`, not `600.0`)."""
    number = float(value)
    return int(number) if number.is_integer() else number


def render_execution(
    execution: Execution, restoration: RawJson | None = None, omitted: Omitted = ()
) -> dict[str, Any]:
    """§4.1; `restoration`: what a fork restored, shown where it is answered on its own
    (§33.8.2); `omitted`: the payloads a list page left out (§5.1)."""
    body: dict[str, Any] = {"id": execution.id, "agent_id": execution.agent_id}
    _set(body, "agent_version", execution.origin.agent_version)
    body["input"] = orjson.Fragment(execution.origin.input)
    body["status"] = execution.status.value
    _set(body, "output", _raw(execution.output))
    _set(body, "failure_reason", execution.failure_reason)
    body["created_at"] = format_timestamp(execution.origin.created_at)
    body["updated_at"] = format_timestamp(execution.updated_at)
    if execution.origin.deadline_at is not None:
        body["deadline_at"] = format_timestamp(execution.origin.deadline_at)
    # §28.1: omitted when none, never null.
    _set(body, "idempotency_key", execution.origin.idempotency_key)
    _set(body, "parent_execution_id", execution.parent_execution_id)
    body["created_by"] = execution.origin.created_by
    _set(body, "on_behalf_of", execution.origin.on_behalf_of)
    body["subject_groups"] = []
    _set(body, "session", execution.origin.session)
    # A waiter of a session shows none; one admitted on create (rows older than the field
    # included) was admitted when it was created.
    admitted = execution.admitted_at
    if admitted is None and execution.origin.session is None:
        admitted = execution.origin.created_at
    if admitted is not None:
        body["admitted_at"] = format_timestamp(admitted)
    _set(body, "spawned_by", spawned_by(execution))
    _set(body, "forked_from", execution.origin.forked_from)
    _set(body, "fork_seq", execution.origin.fork_seq)
    _set(body, "restoration", _raw(restoration))
    if omitted:
        # A list page left these out; `GET /v0/executions/{id}` carries them (§5.1).
        body["omitted"] = dict(omitted)
    return body


def render_execution_page(page: Page[Execution]) -> dict[str, Any]:
    omitted = page.omitted
    body: dict[str, Any] = {
        "executions": [render_execution(e, omitted=omitted.get(e.id, ())) for e in page.items]
    }
    _set(body, "next_cursor", page.next_cursor)
    return body


def render_step(step: Step) -> dict[str, Any]:
    body: dict[str, Any] = {
        "step_id": step.step_id,
        "execution_id": step.execution_id,
        "kind": step.kind.value,
        "target": step.target,
        "args_hash": step.args_hash,
        "occurrence": step.occurrence,
        "status": step.status.value,
        "idempotency": step.idempotency.value,
    }
    _set(body, "args", _raw(step.args))
    _set(body, "result", _raw(step.result))
    _set(body, "error", _raw(step.error))
    if step.usage_input is not None or step.usage_output is not None:
        body["usage"] = {
            "input_tokens": step.usage_input or 0,
            "output_tokens": step.usage_output or 0,
        }
    _set_time(body, "started_at", step)
    _set_time(body, "completed_at", step)
    if step.omitted:
        # A step list left these out; `GET …/steps/{step_id}` carries them (§5.2).
        body["omitted"] = dict(step.omitted)
    return body


def _set_time(body: dict[str, Any], key: str, record: object) -> None:
    moment = getattr(record, key)
    if moment is not None:
        body[key] = format_timestamp(moment)


def render_event(event: Event) -> dict[str, Any]:
    body: dict[str, Any] = {
        "execution_id": event.execution_id,
        "event_seq": event.event_seq,
        "type": event.type,
        "payload": orjson.Fragment(event.payload),
        "occurred_at": format_timestamp(event.occurred_at),
    }
    if event.omitted:
        # An events page left the payload out; the execution or the step carries it (§5.1).
        body["omitted"] = dict(event.omitted)
    return body


def render_approval(approval: Approval) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": approval.id,
        "step_id": approval.step_id,
        "execution_id": approval.execution_id,
        "status": approval.status.value,
        # null (not omitted) when the rule names no approvers: anyone may decide (§4.4).
        "approvers": None if approval.approvers is None else list(approval.approvers),
    }
    _set(body, "message", approval.message)
    body["timeout_at"] = format_timestamp(approval.timeout_at)
    _set(body, "decided_by", approval.decided_by)
    _set(body, "asserted_by", approval.asserted_by)
    _set_time(body, "decided_at", approval)
    _set(body, "rationale", approval.rationale)
    body["created_at"] = format_timestamp(approval.created_at)
    return body


def render_agent(agent: Agent) -> dict[str, Any]:
    """The agent without its secret, which never leaves the kernel."""
    body: dict[str, Any] = {"id": agent.id, "webhook_url": agent.webhook_url}
    _set(body, "policy_bundle", agent.policy_bundle)
    body["registered_at"] = format_timestamp(agent.registered_at)
    if agent.lease_timeout_seconds is not None:
        body["lease_timeout_seconds"] = _number(agent.lease_timeout_seconds)
    # §36.2: what the agent published about itself, each member omitted while unpublished.
    _set(body, "description", agent.metadata.description)
    _set(body, "input_schema", _raw(agent.metadata.input_schema))
    _set(body, "output_schema", _raw(agent.metadata.output_schema))
    _set_time(body, "metadata_updated_at", agent)
    return body


def render_resource(resource: Resource, covered: bool) -> dict[str, Any]:
    """§33.2: `configuration`, `binding` and `checkpoint_ref` omitted when absent."""
    body: dict[str, Any] = {"key": resource.key, "driver_id": resource.driver_id}
    _set(body, "configuration", _raw(resource.configuration))
    body["coverage_reuse"] = resource.coverage_reuse
    body["every_steps"] = resource.every_steps
    body["on_completion"] = resource.on_completion
    body["registered_seq"] = resource.registered_seq
    body["generation"] = resource.generation
    body["count"] = resource.count
    _set(body, "binding", _raw(resource.binding))
    if resource.checkpoint_ref:
        body["checkpoint_ref"] = resource.checkpoint_ref
    body["covered"] = covered
    return body


def render_coverage(
    latest_seq: int, resources: Sequence[Resource], checkpoints: Sequence[Checkpoint]
) -> dict[str, Any]:
    """§33.7: each key's `registered_seq`, and every checkpoint (`invalidated_seq` omitted
    while it is open)."""
    rows = []
    for c in checkpoints:
        row: dict[str, Any] = {
            "key": c.key,
            "generation": c.generation,
            "checkpoint_ref": c.checkpoint_ref,
            "covered_seq": c.covered_seq,
        }
        _set(row, "invalidated_seq", c.invalidated_seq)
        rows.append(row)
    return {
        "latest_seq": latest_seq,
        "resources": {r.key: r.registered_seq for r in resources},
        "checkpoints": rows,
    }


def render_api_key(key: ApiKey) -> dict[str, Any]:
    """A key without its hash (§34.3); a token is added only where one was just made."""
    body: dict[str, Any] = {
        "id": key.id,
        "name": key.name,
        "scopes": [scope.value for scope in key.scopes],
        "created_at": format_timestamp(key.created_at),
    }
    if key.revoked_at is not None:
        body["revoked_at"] = format_timestamp(key.revoked_at)
    _set(body, "created_by", key.created_by)
    return body


def render_decision(decision: StepDecision) -> dict[str, Any]:
    body: dict[str, Any] = {"decision": decision.decision.value}
    _set(body, "step_id", decision.step_id)
    _set(body, "result", _raw(decision.result))
    _set(body, "error", _raw(decision.error))
    _set(body, "approval_id", decision.approval_id)
    _set(body, "reason", decision.reason)
    _set(body, "rule_id", decision.rule_id)
    if decision.resources:
        body["resources"] = [
            {"key": r.key, "generation": r.generation, "due": r.due} for r in decision.resources
        ]
    return body
