"""`GroupCommit`: the optimistic transactions that become ready while others are on their way
to the server go together, as one statement in one transaction, so they share a round trip,
a parse and a commit. Each member waits for that commit before it is answered, so nothing is
acknowledged before it is durable; alone, a transaction is sent as it is, at once.

A grouped member's lock is only tried (`pg_try_advisory_xact_lock`): a group never waits for
a lock, so it cannot deadlock with the ordinary transactions or with another replica's
groups, whatever order they lock in. A member whose execution is locked at that moment
answers "changed" (`Stale`), and its use case goes the ordinary way, as it does when the
execution moved. When the group's statement fails (one member's writes broke a constraint, or
the server went away), every member sends its own statement again, alone, so each gets its
own answer and its own error.
Must import only psycopg, orjson, the domain, `store.base`, `rebuno.kernel.pgserver` and
this package.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import orjson

from rebuno.kernel.pgserver import Server
from rebuno.kernel.store.base import Unchanged
from rebuno.kernel.store.postgres import writes
from rebuno.kernel.store.postgres.connection import Connection, translated

GROUP_LIMIT = 64
"""Members in one statement at most; more wait for the next."""
LANES = 2
"""Groups on their way to the server at once, each on a connection of its own."""


@dataclass(frozen=True, slots=True)
class Member:
    """One optimistic transaction: what `rebuno_apply_unchanged` takes, as one JSON object."""

    lock: int
    """The execution's advisory-lock key."""
    execution_id: str
    unchanged: Unchanged
    """The condition, sent whole under its field names: `rebuno_unchanged` evaluates it."""
    ops: str
    """The writes, encoded (`writes.Writes.take`)."""

    def item(self) -> dict[str, object]:
        """The member as `rebuno_apply_unchanged`'s argument, and as an element of
        `rebuno_apply_unchanged_all`'s."""
        return {
            "lock": self.lock,
            "execution_id": self.execution_id,
            "unchanged": self.unchanged,
            "ops": orjson.Fragment(self.ops),
        }


Connect = Callable[[], AbstractAsyncContextManager[Connection]]


class GroupCommit:
    """Sends optimistic statements, grouping those that wait (see the module)."""

    def __init__(self, connect: Connect, server: Server) -> None:
        self._connect = connect
        self._server = server
        self._waiting: list[tuple[Member, asyncio.Future[bool | None]]] = []
        self._lanes = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def apply(self, member: Member) -> bool:
        """Whether the member's writes applied (committed); False when its condition did not
        hold and nothing was written."""
        if self._lanes >= LANES:
            future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
            self._waiting.append((member, future))
            applied = await future
            if applied is not None:
                return applied
            return await self._alone(member)
        self._lanes += 1
        try:
            return await self._alone(member)
        finally:
            self._lanes -= 1
            self._drain_soon()

    def _drain_soon(self) -> None:
        if self._waiting and self._lanes < LANES:
            self._lanes += 1
            task = asyncio.create_task(self._drain(), name="rebuno-group-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Sends the waiting members, a group at a time, until none waits."""
        group: list[tuple[Member, asyncio.Future[bool | None]]] = []
        try:
            while self._waiting:
                group = self._waiting[:GROUP_LIMIT]
                del self._waiting[:GROUP_LIMIT]
                # None: the member sends its own statement. A member left alone does at once;
                # when the group's statement failed, each does, to meet its own error.
                applied: Sequence[bool | None] = [None]
                if len(group) > 1:
                    try:
                        applied = await self._together([m for m, _ in group])
                    except Exception:
                        applied = [None] * len(group)
                for (_, future), outcome in zip(group, applied, strict=True):
                    if not future.done():  # its waiter may have been cancelled
                        future.set_result(outcome)
        finally:
            # Cancelled on its way: the members not answered go alone, and none is left waiting.
            for _, future in group:
                if not future.done():
                    future.set_result(None)
            self._lanes -= 1
            self._drain_soon()

    async def _alone(self, member: Member) -> bool:
        async with self._connect() as conn:
            with translated(self._server):
                item = orjson.dumps(member.item()).decode()
                cur = await conn.execute(writes.APPLY_UNCHANGED, (item,))
                row = await cur.fetchone()
        if row is None:
            return False
        (applied,) = row
        return bool(applied)

    async def _together(self, members: list[Member]) -> list[bool]:
        items = orjson.dumps([member.item() for member in members]).decode()
        async with self._connect() as conn:
            with translated(self._server):
                cur = await conn.execute(writes.APPLY_UNCHANGED_ALL, (items,))
                row = await cur.fetchone()
        (applied,) = row or ([],)
        if len(applied) != len(members):
            raise RuntimeError("rebuno_apply_unchanged_all answered for other members")
        return [bool(one) for one in applied]

    async def close(self) -> None:
        """Waits for the groups on their way."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
