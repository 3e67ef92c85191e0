"""Scoped API key use cases (§34.3, §34.4): issue, list, rotate, revoke, and verify a token.

A token is shown once, in the answer to its creation or rotation, and never logged; only its
SHA-256 is stored. Verification reads the key on every request (no cache), so a revocation
or rotation holds on every replica from the moment it commits (§34.7). Must not import a
concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace

from rebuno.kernel.domain import api_key
from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import Conflict, NotFound
from rebuno.kernel.domain.principal import Principal, key_principal
from rebuno.kernel.service.context import Context, new_id
from rebuno.protocol.enums import Scope


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A key and its token, returned only by the use case that made the token."""

    key: ApiKey
    token: str


class ApiKeyUseCases(Context):
    async def create_api_key(
        self, name: str, scopes: tuple[Scope, ...], principal: Principal
    ) -> IssuedKey:
        key_id = new_id()
        token = api_key.token_for(key_id, secrets.token_bytes(api_key.SECRET_BYTES))
        key = ApiKey(
            id=key_id,
            name=api_key.key_name(name),
            scopes=scopes,
            secret_hash=api_key.token_hash(token),
            created_at=self.clock(),
            created_by=principal.id,
        )
        async with self.transaction() as tx:
            await tx.insert_api_key(key)
        return IssuedKey(key, token)

    async def list_api_keys(self) -> list[ApiKey]:
        return await self.store.list_api_keys()

    async def rotate_api_key(self, key_id: str) -> IssuedKey:
        """A new token for the same key; the old one stops verifying when this commits."""
        key = await self._existing(key_id)
        if key.revoked_at is not None:
            raise Conflict(f"api key {key_id} is revoked")
        token = api_key.token_for(key_id, secrets.token_bytes(api_key.SECRET_BYTES))
        new_hash = api_key.token_hash(token)
        async with self.transaction() as tx:
            swapped = await tx.rotate_api_key(key_id, key.secret_hash, new_hash)
        if not swapped:  # revoked or rotated by someone else since it was read
            raise Conflict(f"api key {key_id} changed while it was being rotated")
        return IssuedKey(replace(key, secret_hash=new_hash), token)

    async def revoke_api_key(self, key_id: str) -> None:
        """Idempotent: a repeat keeps the first `revoked_at`."""
        async with self.transaction() as tx:
            await tx.revoke_api_key(key_id, self.clock())

    async def verify_api_key(self, token: str) -> Principal | None:
        """The principal of a live key's token, or None for any other text."""
        key_id = api_key.token_key_id(token)
        if key_id is None:
            return None
        key = await self.store.find_api_key(key_id)
        if key is None or not api_key.verifies(key, token):
            return None
        return key_principal(key.id, key.name, frozenset(key.scopes))

    async def _existing(self, key_id: str) -> ApiKey:
        key = await self.store.find_api_key(key_id)
        if key is None:
            raise NotFound(f"api key {key_id} not found")
        return key
