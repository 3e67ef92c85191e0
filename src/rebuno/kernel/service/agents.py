"""Agent and policy administration, and the secret lookup behind agent signatures.

Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

import time
from typing import Any

from rebuno.kernel.config import webhook_targets
from rebuno.kernel.domain.dispatch import lease_timeout_problem
from rebuno.kernel.domain.errors import NotFound, ValidationFailed
from rebuno.kernel.domain.records import Agent, AgentMetadata
from rebuno.kernel.policy.description import Probe, describe_bundle, try_bundle
from rebuno.kernel.service.context import Context

# Secrets are read on every signed agent request. A short cache saves that read; a secret
# rotated on another replica is honoured here within this many seconds.
SECRET_TTL_SECONDS = 5.0
MAX_DESCRIPTION_BYTES = 8 * 1024
MAX_SCHEMA_BYTES = 256 * 1024
"""Bounds of what an agent publishes about itself (§36.1), in bytes of UTF-8: the
description, and each schema as canonical JSON."""
SECRETS_REMEMBERED = 4096
"""Ids remembered at most, known or not, the oldest forgotten first: anyone may send any
`Rebuno-Agent-Id`, so the cache must not grow with what they send."""


class AgentUseCases(Context):
    async def agent_secret(self, agent_id: str) -> str | None:
        hit = self.secrets.get(agent_id)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        try:
            secret: str | None = (await self.store.get_agent(agent_id, metadata=False)).secret
        except NotFound:
            secret = None
        self.secrets[agent_id] = (time.monotonic() + SECRET_TTL_SECONDS, secret)
        self.secrets.move_to_end(agent_id)
        while len(self.secrets) > SECRETS_REMEMBERED:
            self.secrets.popitem(last=False)
        return secret

    async def register_agent(
        self,
        agent_id: str,
        webhook_url: str,
        secret: str,
        lease_timeout_seconds: float | None,
        policy_bundle: str | None,
        keep_bundle: bool = True,
    ) -> Agent:
        for field, value in (("id", agent_id), ("webhook_url", webhook_url), ("secret", secret)):
            if not value:
                raise ValidationFailed(f"validation error: agent {field} is required")
        if (problem := webhook_targets(self.settings).problem(webhook_url)) is not None:
            raise ValidationFailed(f"validation error: {problem}")
        if lease_timeout_seconds is not None and (
            problem := lease_timeout_problem(lease_timeout_seconds)
        ):
            raise ValidationFailed(f"validation error: {problem}")
        if policy_bundle:
            self.bundles.get(policy_bundle)
        agent = Agent(
            id=agent_id,
            webhook_url=webhook_url,
            secret=secret,
            policy_bundle=policy_bundle or None,
            lease_timeout_seconds=lease_timeout_seconds,
            registered_at=self.clock(),
        )
        async with self.transaction() as tx:
            stored = await tx.upsert_agent(agent, keep_bundle=keep_bundle and policy_bundle is None)
        self._forget(agent_id)
        return stored

    async def list_agents(self) -> list[Agent]:
        return await self.store.list_agents()

    async def get_agent(self, agent_id: str) -> Agent:
        return await self.store.get_agent(agent_id)

    async def delete_agent(self, agent_id: str) -> None:
        async with self.transaction() as tx:
            await tx.delete_agent(agent_id)
        self._forget(agent_id)

    async def publish_metadata(self, agent_id: str, metadata: AgentMetadata) -> None:
        """§36.1: replaces what the agent said about itself, whole; the last writer wins."""
        if (problem := metadata_problem(metadata)) is not None:
            raise ValidationFailed(f"validation error: {problem}")
        async with self.transaction() as tx:
            await tx.update_agent_metadata(agent_id, metadata, self.clock())

    async def set_policy(self, agent_id: str, bundle: str) -> None:
        """Validates before storing, so a bad bundle never replaces the one in force."""
        if bundle:
            self.bundles.get(bundle)
        async with self.transaction() as tx:
            await tx.set_policy_bundle(agent_id, bundle or None)

    async def check_policy(
        self, agent_id: str, bundle: str | None, probe: Probe | None
    ) -> dict[str, Any]:
        """§40.6: a bundle (the agent's current one when None) validated by the loader and
        described, and with a probe, what it would decide for that step. Stores nothing."""
        if bundle is None:
            bundle = (await self.store.get_agent(agent_id)).policy_bundle or ""
        checked = describe_bundle(bundle)
        if probe is not None:
            checked["decision"] = try_bundle(bundle, probe)
        return checked

    def _forget(self, agent_id: str) -> None:
        self.secrets.pop(agent_id, None)


def metadata_problem(metadata: AgentMetadata) -> str | None:
    """What exceeds §36.1's bounds, if anything."""
    fields = (
        ("description", metadata.description, MAX_DESCRIPTION_BYTES),
        ("input_schema", metadata.input_schema, MAX_SCHEMA_BYTES),
        ("output_schema", metadata.output_schema, MAX_SCHEMA_BYTES),
    )
    for name, value, limit in fields:
        if value is not None and len(value.encode("utf-8", "surrogatepass")) > limit:
            return f"{name} is longer than {limit} bytes"
    return None
