"""Agent instances (`agent-instances`): a restarted agent process announces its new
incarnation, and the deliveries an earlier incarnation of the same instance acknowledged are
reclaimed at once instead of when their leases expire.

Reclaiming goes the way lease expiry does: under each execution's lock the attempt's lease is
ended (backdated), then the reaper's reclaim returns it to the queue and wakes the dispatch
loop. So a terminal execution is never touched, and a reclaimed attempt is redelivered, with
the next attempt number, exactly as an expired one would be.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from rebuno.kernel.domain.dispatch import owns
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Dispatch, Lease, SeenRequest
from rebuno.kernel.service.context import Context, log
from rebuno.protocol.extensions import AgentInstance

ANNOUNCE_LIMIT = 1000
"""Deliveries one announcement reclaims at most; any beyond wait for their leases."""


class InstanceUseCases(Context):
    async def announce_instance(
        self, agent_id: str, instance: AgentInstance, seen: SeenRequest | None = None
    ) -> int:
        """An incarnation of `instance` of agent `agent_id` has started: every delivery of the
        agent acknowledged by an instance of that name with another incarnation is dead, and
        goes back to the queue now. Idempotent. Returns how many it reclaimed.

        A copy of an announcement already accepted (`seen`, §2.3) reclaims nothing: replayed
        after a later incarnation announced itself, it would otherwise end that one's work."""
        copy = seen and await self.store.remember_request(seen.digest, self.clock(), seen.until)
        if copy:
            return 0
        held = await self.store.list_superseded_dispatches(agent_id, instance, ANNOUNCE_LIMIT)
        ended = 0
        for dispatch in held:
            ended += await self._end_lease(dispatch)
        if ended:
            log.info(
                "agent %s instance %s restarted (incarnation %s): reclaiming %d deliveries",
                agent_id,
                instance.name,
                instance.incarnation,
                ended,
            )
            await self.reclaim_expired_leases()
            self.wake()  # another replica's reaper may have taken them first
        return ended

    async def _end_lease(self, dispatch: Dispatch) -> int:
        """1 when it ended the lease of this attempt: it is still the live one, and its
        execution is not terminal (a completion may have won the lock meanwhile)."""
        lease = Lease(dispatch.id, dispatch.attempt)
        try:
            async with self.transaction(dispatch.execution_id) as tx:
                execution = await tx.get_execution(dispatch.execution_id)
                current = await tx.get_dispatch(dispatch.id)
                if execution.status.is_terminal or not owns(current, lease):
                    return 0
                await tx.expire_lease(dispatch.id, dispatch.attempt)
        except NotFound:  # deleted by retention since it was listed
            return 0
        return 1
