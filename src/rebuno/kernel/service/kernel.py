"""`Kernel`: every use case of the kernel, composed.

Each use-case class derives from `context.Context` alone and sits beside the others: none
imports another, and what several share is a transaction fragment below them (an import
contract says so). `Kernel` is their composition, the object the API, the background loops
and the tests call. Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import asyncio

from rebuno.kernel.service.agents import AgentUseCases
from rebuno.kernel.service.api_keys import ApiKeyUseCases
from rebuno.kernel.service.approvals import ApprovalUseCases
from rebuno.kernel.service.context import log
from rebuno.kernel.service.dispatches import DispatchUseCases
from rebuno.kernel.service.executions import ExecutionUseCases
from rebuno.kernel.service.forks import ForkUseCases
from rebuno.kernel.service.instances import InstanceUseCases
from rebuno.kernel.service.lineage import LineageUseCases
from rebuno.kernel.service.policytests import PolicyTestUseCases
from rebuno.kernel.service.queries import QueryUseCases
from rebuno.kernel.service.resources import ResourceUseCases
from rebuno.kernel.service.steps import StepUseCases

READY_TIMEOUT_SECONDS = 2.0


class Kernel(
    StepUseCases,
    ExecutionUseCases,
    QueryUseCases,
    ApprovalUseCases,
    LineageUseCases,
    ForkUseCases,
    ResourceUseCases,
    DispatchUseCases,
    InstanceUseCases,
    AgentUseCases,
    ApiKeyUseCases,
    PolicyTestUseCases,
):
    """Every use case of the kernel; each opens exactly one store transaction."""

    async def ready(self) -> bool:
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                await self.store.ping()
        except Exception as exc:  # any failure means "not ready"; the reason is logged
            log.warning("readiness check failed: %s", exc)
            return False
        return True
