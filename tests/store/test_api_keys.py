"""The store contract for API keys (§34.4): every field round-trips, rotation is a
compare-and-swap, revocation keeps its first time, and keys list in creation order."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.store.base import Store
from rebuno.protocol.enums import Scope
from tests.support import START

FIRST = "0192f3a4-0000-7000-8000-000000000001"
SECOND = "0192f3a4-0000-7000-8000-000000000002"
OLD, NEW, OTHER = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def key(key_id: str = FIRST, **fields: object) -> ApiKey:
    base = ApiKey(
        id=key_id,
        name="ci",
        scopes=(Scope.APPROVALS_WRITE, Scope.EXECUTIONS_READ),
        secret_hash=OLD,
        created_at=START,
        created_by="bootstrap",
    )
    return replace(base, **fields)  # type: ignore[arg-type]  # fields of ApiKey


async def insert(store: Store, record: ApiKey) -> None:
    async with store.transaction() as tx:
        await tx.insert_api_key(record)


async def test_a_key_round_trips_every_field(store: Store) -> None:
    await insert(store, key())

    assert await store.find_api_key(FIRST) == key()
    assert await store.find_api_key(SECOND) is None


async def test_keys_list_in_id_order_revoked_ones_included(store: Store) -> None:
    await insert(store, key(SECOND, name="second", created_by=None))
    await insert(store, key(FIRST))
    async with store.transaction() as tx:
        await tx.revoke_api_key(FIRST, START)

    listed = await store.list_api_keys()

    assert listed == [key(revoked_at=START), key(SECOND, name="second", created_by=None)]


async def test_rotation_swaps_only_the_hash_it_was_given(store: Store) -> None:
    await insert(store, key())

    async with store.transaction() as tx:
        lost = await tx.rotate_api_key(FIRST, OTHER, NEW)
        won = await tx.rotate_api_key(FIRST, OLD, NEW)

    assert (lost, won) == (False, True)
    assert await store.find_api_key(FIRST) == key(secret_hash=NEW)


async def test_a_revoked_key_is_never_rotated_and_keeps_its_first_revocation(
    store: Store,
) -> None:
    await insert(store, key())
    async with store.transaction() as tx:
        await tx.revoke_api_key(FIRST, START)
        await tx.revoke_api_key(FIRST, START + timedelta(hours=1))
        rotated = await tx.rotate_api_key(FIRST, OLD, NEW)

    assert rotated is False
    assert await store.find_api_key(FIRST) == key(revoked_at=START)


async def test_revoking_an_unknown_key_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        async with store.transaction() as tx:
            await tx.revoke_api_key(FIRST, START)
