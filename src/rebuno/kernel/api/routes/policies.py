"""`POST /v0/policies/{agent_id}` (§5.3, bearer): replace or remove an agent's bundle;
`POST /v0/policies/{agent_id}/test` (§35): what a bundle decides for cases or for the steps
of recorded executions, without writing anything; and `POST /v0/policies/{agent_id}/check`
(§40.6): validate a bundle, describe its rules and try it against one step, without saving.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import (
    JsonObject,
    integer_field,
    is_text,
    parse_object,
    raw_field,
    text_field,
)
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import json_response, no_content
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.policy.description import Probe
from rebuno.kernel.policy.suite import report_fields
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.service.policytests import (
    REPLAYED_AT_MOST,
    REPLAYED_BY_DEFAULT,
    PolicyTest,
    ReplayedExecutions,
)
from rebuno.protocol.enums import Scope, StepKind
from rebuno.protocol.times import parse_timestamp

_SELECTOR_KEYS = frozenset({"session", "since", "limit"})


def _probe(agent_id: str, body: JsonObject) -> Probe | None:
    """`step`: `{"kind", "target"?, "args"?}`, the step to try the bundle against."""
    step = body.get("step")
    if step is None:
        return None
    if not isinstance(step, dict):
        raise ValidationFailed("validation error: step must be an object")
    kind = text_field(step, "kind", required=True)
    if kind not in StepKind.__members__.values():
        raise ValidationFailed(f"validation error: unknown step kind {kind!r}")
    return Probe(agent_id, StepKind(kind), text_field(step, "target"), raw_field(step, "args"))


class PolicyRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        one = "/v0/policies/{agent_id}"
        return [
            route(one, POST=self._gate.scoped(self.set, Scope.POLICIES_WRITE)),
            route(
                one + "/test",
                POST=self._gate.scoped(self.test, Scope.POLICIES_WRITE, Scope.EXECUTIONS_READ),
            ),
            route(one + "/check", POST=self._gate.scoped(self.check, Scope.POLICIES_WRITE)),
        ]

    async def set(self, request: Request) -> Response:
        body = parse_object(await self._gate.client(request))
        bundle = body.get("bundle")
        if not is_text(bundle):
            raise ValidationFailed('validation error: bundle must be a string ("" removes it)')
        await self._kernel.set_policy(params.agent_id(request.path_params["agent_id"]), str(bundle))
        return no_content()

    async def check(self, request: Request) -> Response:
        body = parse_object(await self._gate.client(request))
        agent_id = params.agent_id(request.path_params["agent_id"])
        bundle = body.get("bundle")
        if bundle is not None and not is_text(bundle):
            raise ValidationFailed("validation error: bundle must be a string")
        checked = await self._kernel.check_policy(
            agent_id, None if bundle is None else str(bundle), _probe(agent_id, body)
        )
        return json_response(checked)

    async def test(self, request: Request) -> Response:
        body = parse_object(await self._gate.client(request))
        agent_id = params.agent_id(request.path_params["agent_id"])
        report = await self._kernel.test_policy(agent_id, policy_test(body))
        return json_response(report_fields(report, orjson.Fragment))


def policy_test(body: JsonObject) -> PolicyTest:
    """§35.1's request: `bundle`, `cases`, `execution_id`, `executions`, each optional."""
    cases = body.get("cases")
    if cases is not None and not isinstance(cases, list):
        raise ValidationFailed("validation error: cases must be an array")
    execution_id = text_field(body, "execution_id")
    return PolicyTest(
        bundle=text_field(body, "bundle"),
        cases=cases or (),
        execution_id=params.parse_uuid(execution_id, "execution_id") if execution_id else None,
        executions=_selector(body.get("executions")),
    )


def _selector(value: object) -> ReplayedExecutions | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationFailed("validation error: executions must be an object")
    for key in value:
        if key not in _SELECTOR_KEYS:
            known = ", ".join(sorted(_SELECTOR_KEYS))
            raise ValidationFailed(f"validation error: executions.{key}: unknown field ({known})")
    since = text_field(value, "since")
    limit = integer_field(value, "limit") if value.get("limit") is not None else 0
    try:
        since_at = parse_timestamp(since) if since else None
    except ValueError as exc:
        raise ValidationFailed(f"validation error: executions.since: {exc}") from None
    return ReplayedExecutions(
        session=text_field(value, "session") or None,
        since=since_at,
        limit=REPLAYED_BY_DEFAULT if limit <= 0 else min(limit, REPLAYED_AT_MOST),
    )
