"""`AdminClient`: the SDK `Client` plus what the command line needs beyond it: the agent
administration routes (§5.3), the API key routes (§34.3), registering a provisioning
manifest's agents, and resolving the short id prefixes people type (of executions, approvals
and steps).

Talks to the kernel over HTTP only, through the `Client`'s request machinery. Reads a manifest
with `rebuno.kernel.manifest` (an offline file parser); imports nothing else of the kernel.
"""

from __future__ import annotations

import builtins
import json
import re
import uuid
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from rebuno.kernel.domain.errors import KernelError
from rebuno.kernel.manifest import load_manifest
from rebuno.sdk.client import Client

PREFIX_WINDOW = 200
"""A short execution id must be unique among this many of the newest executions."""
_STEP_ID = re.compile(r"[0-9a-f]{64}")


class InputError(Exception):
    """What the user typed cannot be used: an unknown or ambiguous id prefix, a bad manifest."""


class AgentInfo(BaseModel):
    """An agent as the kernel returns it (§4.5): never its secret."""

    model_config = ConfigDict(extra="ignore")

    id: str
    webhook_url: str = ""
    policy_bundle: str | None = None
    registered_at: str = ""
    lease_timeout_seconds: float | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    metadata_updated_at: str | None = None


class AdminClient(Client):
    """`Client` with agent administration and id resolution, for the CLI and the REPL."""

    async def register_agent(
        self,
        agent_id: str,
        webhook_url: str,
        secret: str,
        *,
        lease_timeout_seconds: float | None = None,
        policy_bundle: str | None = None,
    ) -> AgentInfo:
        """Upsert an agent. `policy_bundle=None` keeps the stored bundle; `""` removes it."""
        body: dict[str, Any] = {"id": agent_id, "webhook_url": webhook_url, "secret": secret}
        if lease_timeout_seconds is not None:
            body["lease_timeout_seconds"] = lease_timeout_seconds
        if policy_bundle is not None:
            body["policy_bundle"] = policy_bundle
        response = await self._request("POST", "/v0/agents", json=body)
        return AgentInfo.model_validate_json(response.body)

    async def list_agents(self) -> builtins.list[AgentInfo]:
        response = await self._request("GET", "/v0/agents")
        return [AgentInfo.model_validate(item) for item in json.loads(response.body) or []]

    async def get_agent(self, agent_id: str) -> AgentInfo:
        response = await self._request("GET", f"/v0/agents/{quote(agent_id, safe='')}")
        return AgentInfo.model_validate_json(response.body)

    async def delete_agent(self, agent_id: str) -> None:
        await self._request("DELETE", f"/v0/agents/{quote(agent_id, safe='')}")

    async def set_policy(self, agent_id: str, bundle: str) -> None:
        """Replace the agent's bundle (`""` removes it)."""
        path = f"/v0/policies/{quote(agent_id, safe='')}"
        await self._request("POST", path, json={"bundle": bundle})

    async def test_policy(self, agent_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """The report of `POST /v0/policies/{agent_id}/test` (§35.1) for this request."""
        path = f"/v0/policies/{quote(agent_id, safe='')}/test"
        response = await self._request("POST", path, json=request)
        report: dict[str, Any] = json.loads(response.body)
        return report

    async def create_api_key(self, name: str, scopes: builtins.list[str]) -> Any:
        """The issued key (§34.3), its token included: the only time the token is shown."""
        body = {"name": name, "scopes": scopes}
        return json.loads((await self._request("POST", "/v0/api-keys", json=body)).body)

    async def list_api_keys(self) -> Any:
        return json.loads((await self._request("GET", "/v0/api-keys")).body)

    async def rotate_api_key(self, key_id: str) -> Any:
        path = f"/v0/api-keys/{quote(key_id, safe='')}/rotate"
        return json.loads((await self._request("POST", path)).body)

    async def revoke_api_key(self, key_id: str) -> None:
        await self._request("DELETE", f"/v0/api-keys/{quote(key_id, safe='')}")

    async def register_manifest(self, path: str) -> builtins.list[AgentInfo]:
        """Upsert every agent of a provisioning manifest (§18.4); each entry defines its agent
        completely, so an entry without a policy removes the stored bundle."""
        try:
            specs = load_manifest(path)
        except KernelError as exc:
            raise InputError(exc.message) from None
        return [
            await self.register_agent(
                spec.id,
                spec.webhook_url,
                spec.secret,
                lease_timeout_seconds=spec.lease_timeout_seconds,
                policy_bundle=spec.policy_bundle or "",
            )
            for spec in specs
        ]

    async def resolve_execution_id(self, text: str) -> str:
        """A full id as given, or the one execution among the newest whose id starts so."""
        if _is_uuid(text):
            return text.lower()
        page = await self.list(limit=PREFIX_WINDOW)
        return _unique(text, [execution.id for execution in page.executions], "execution")

    async def resolve_approval_id(self, text: str) -> str:
        """A full id as given, or the one approval whose id starts so."""
        if _is_uuid(text):
            return text.lower()
        approvals = await self.list_approvals(status="all")
        return _unique(text, [approval.id for approval in approvals], "approval")

    async def resolve_step_id(self, execution_id: str, text: str) -> str:
        """A full step id as given, or the one step of the execution whose id starts so."""
        if _STEP_ID.fullmatch(text):
            return text
        steps = await self.list_steps(execution_id)
        return _unique(text, [step.step_id for step in steps], "step")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


def _unique(prefix: str, ids: builtins.list[str], what: str) -> str:
    wanted = prefix.strip().lower()
    if not wanted:
        article = "an" if what[0] in "aeiou" else "a"
        raise InputError(f"{article} {what} id is required")
    matches = [candidate for candidate in ids if candidate.startswith(wanted)]
    if not matches:
        raise InputError(f"no {what} id starts with {prefix!r}")
    if len(matches) > 1:
        raise InputError(f"{prefix!r} matches {len(matches)} {what}s; type more of the id")
    return matches[0]
