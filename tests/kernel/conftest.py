"""Fixtures for behaviour tests through the service layer: a real `Kernel` over the `store`
fixture (both backends), driven by a manual clock, and a harness for the agent's side."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, cast

import pytest

from rebuno.kernel.config import Settings
from rebuno.kernel.domain.decision import StepDecision, StepRequest
from rebuno.kernel.domain.dispatch import DeliveryOutcome, Webhook
from rebuno.kernel.domain.records import Execution, Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.protocol.canonical import args_hash, canonical_args
from rebuno.protocol.enums import Idempotency, StepKind
from rebuno.protocol.extensions import AGENT_INSTANCES, AgentInstance
from tests.counting import Counting
from tests.support import ManualClock

AGENT = "researcher"
LEASE = timedelta(seconds=30)


def request(
    target: str = "web_search",
    args: str | None = '{"query": "durable agents"}',
    *,
    kind: StepKind = StepKind.TOOL_CALL,
    idempotency: Idempotency = Idempotency.SAFE_TO_RETRY,
) -> StepRequest:
    text = canonical_args(args)
    return StepRequest(kind, target, None if args is None else text, args_hash(text), idempotency)


@dataclass
class Run:
    """One execution as its agent sees it: the id and the lease of the current delivery."""

    kernel: Kernel
    execution_id: str
    lease: Lease

    async def submit(self, req: StepRequest | None = None) -> StepDecision:
        return await self.kernel.submit_step(self.execution_id, AGENT, self.lease, req or request())

    async def complete(self, step_id: str, result: str = '{"ok":true}') -> StepDecision:
        return await self.kernel.complete_step(
            self.execution_id, AGENT, step_id, self.lease, result
        )

    async def fail(self, step_id: str, error: str = '{"message":"boom"}') -> StepDecision:
        return await self.kernel.fail_step(self.execution_id, AGENT, step_id, self.lease, error)

    async def execution(self) -> Execution:
        return await self.kernel.get_execution(self.execution_id)

    async def event_types(self) -> list[str]:
        return [e.type for e in await self.kernel.list_events(self.execution_id, 0, 1000)]


def settings(**changes: Any) -> Settings:
    base = Settings(
        dev=True,
        dispatch_lease_timeout=LEASE,
        dispatch_max_attempts=3,
        backoff_base=timedelta(milliseconds=10),
        backoff_max=timedelta(milliseconds=40),
        dispatch_poll_interval=timedelta(milliseconds=20),
        replica_id="replica-a",
    )
    return replace(base, **changes)


@pytest.fixture
def kernel_settings(shortcuts: bool) -> Settings:
    return settings(shortcuts=shortcuts)


@pytest.fixture
def counts(store: Store) -> Counting:
    """The kernel's store, counting the transactions and committed reads it serves."""
    return Counting(store)


@pytest.fixture
async def kernel(counts: Counting, clock: ManualClock, kernel_settings: Settings) -> Kernel:
    kernel = Kernel(cast(Store, counts), kernel_settings, clock=clock.now, bus=MemoryBus())
    await kernel.register_agent(AGENT, "http://127.0.0.1:9/webhook", "s3cret", None, None)
    return kernel


async def claim(kernel: Kernel, execution_id: str) -> Lease:
    """Claims the execution's due dispatch, as the dispatch loop would before delivering."""
    for claimed in await kernel.claim(10):
        if claimed.dispatch.execution_id == execution_id:
            return Lease(claimed.dispatch.id, claimed.dispatch.attempt)
    raise AssertionError(f"no due dispatch for execution {execution_id}")


async def redeliver(kernel: Kernel, clock: ManualClock, run: Run) -> Run:
    """Lets the lease expire, and claims the returned dispatch again (the next attempt)."""
    clock.advance(LEASE + timedelta(seconds=1))
    assert await kernel.store.reclaim_expired(clock.now(), LEASE) == 1
    return Run(kernel, run.execution_id, await claim(kernel, run.execution_id))


@pytest.fixture
async def run(kernel: Kernel) -> AsyncIterator[Run]:
    """An execution whose first dispatch has been claimed: the agent holds a live lease."""
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    yield Run(kernel, execution.id, await claim(kernel, execution.id))


@dataclass(frozen=True)
class Sent:
    """One webhook as an `Answering` deliverer received it."""

    execution_id: str
    body: bytes
    extensions: tuple[str, ...]
    carried: str | None


@dataclass
class Answering:
    """A deliverer whose agent answers every webhook 2xx at once, keeping what it was sent,
    and naming itself as `instance` (`agent-instances`) when one is given. `answer` runs
    before the answer is returned: what the agent does meanwhile."""

    sent: list[Sent] = field(default_factory=list)
    instance: AgentInstance | None = None

    async def deliver(self, webhook: Webhook) -> DeliveryOutcome:
        self.sent.append(
            Sent(webhook.execution_id, webhook.body, webhook.extensions, webhook.carried)
        )
        await self.answer(webhook.execution_id)
        return DeliveryOutcome(ok=True, instance=self.instance)

    async def answer(self, execution_id: str) -> None:
        return None


async def delivered(kernel: Kernel, instance: AgentInstance | None, agent_id: str = AGENT) -> Run:
    """A new execution, delivered and acknowledged by `instance`."""
    execution = await kernel.create_execution(agent_id, '{"topic":"x"}', None)
    deliverer = Answering(instance=instance)
    [claimed] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    await kernel.deliver(claimed, deliverer)
    assert AGENT_INSTANCES in deliverer.sent[0].extensions
    return Run(kernel, execution.id, Lease(claimed.dispatch.id, claimed.dispatch.attempt))
