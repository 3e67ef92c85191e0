"""Approval routes (§5.3, bearer): list, read, grant and deny.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import parse_object, text_field
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import json_response, no_content, render_approval
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import ApprovalStatus, Scope

ALL = "all"


def approval_status(text: str) -> ApprovalStatus | None:
    """`status` defaults to `pending` (what SDK 0.16 asks for); `all` lifts the filter."""
    if not text:
        return ApprovalStatus.PENDING
    if text == ALL:
        return None
    try:
        return ApprovalStatus(text)
    except ValueError:
        allowed = ", ".join([ALL, *(status.value for status in ApprovalStatus)])
        raise ValidationFailed(f"validation error: status must be one of {allowed}") from None


def approval_id(request: Request) -> str:
    return params.parse_uuid(request.path_params["approval_id"], "approval id")


class ApprovalRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        one = "/v0/approvals/{approval_id}"
        return [
            route("/v0/approvals", GET=self._gate.scoped(self.list, Scope.APPROVALS_READ)),
            route(one, GET=self._gate.scoped(self.get, Scope.APPROVALS_READ)),
            route(one + "/grant", POST=self._gate.scoped(self.grant, Scope.APPROVALS_WRITE)),
            route(one + "/deny", POST=self._gate.scoped(self.deny, Scope.APPROVALS_WRITE)),
        ]

    async def list(self, request: Request) -> Response:
        await self._gate.client(request)
        query = request.query_params
        approvals = await self._kernel.list_approvals(
            approval_status(params.first(query, "status")),
            params.optional_uuid(query, "execution_id"),
        )
        return json_response([render_approval(approval) for approval in approvals])

    async def get(self, request: Request) -> Response:
        await self._gate.client(request)
        approval = await self._kernel.get_approval(approval_id(request))
        return json_response(render_approval(approval))

    async def grant(self, request: Request) -> Response:
        raw, principal = await self._gate.principal(request)
        body = parse_object(raw)
        target = approval_id(request)
        await self._kernel.grant_approval(
            target, text_field(body, "decided_by"), text_field(body, "rationale"), principal
        )
        return no_content()

    async def deny(self, request: Request) -> Response:
        raw, principal = await self._gate.principal(request)
        body = parse_object(raw)
        target = approval_id(request)
        await self._kernel.deny_approval(
            target, text_field(body, "decided_by"), text_field(body, "rationale"), principal
        )
        return no_content()
