"""Who a bearer request acts as (§34.5): the bootstrap token, a scoped API key, or anyone in
dev mode; and the rules that follow from it for approvals. Pure: imports `protocol` and the
domain only.
"""

from __future__ import annotations

from dataclasses import dataclass

from rebuno.kernel.domain.errors import Forbidden
from rebuno.protocol.enums import Scope

KEY_PREFIX = "key:"
EVERY_SCOPE = frozenset(Scope)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: `id` is what the kernel records (`bootstrap`, `anonymous` or
    `key:<key id>`); `key_name` is a scoped key's name, None for the other two."""

    id: str
    scopes: frozenset[Scope]
    key_name: str | None = None

    def require(self, scope: Scope) -> None:
        """Raises `Forbidden` unless the principal holds `scope`."""
        if scope not in self.scopes:
            raise Forbidden(f"forbidden: this credential lacks the {scope} scope")

    def decider(self, named: str) -> str:
        """The `decided_by` of a grant or deny that named `named`: a scoped key decides only
        as its own name (another name is `Forbidden`); the bootstrap token and anonymous dev
        callers are trusted to name the person."""
        if self.key_name is None:
            return named
        if named and named != self.key_name:
            raise Forbidden(f"forbidden: {self.id} decides as {self.key_name!r} only")
        return self.key_name

    def may_approve(self, approvers: tuple[str, ...] | None, decided_by: str) -> bool:
        """Whether a non-empty approver list admits this decision: by the name decided as,
        or by an entry `key:<id>` naming this very key."""
        if not approvers:
            return True
        return decided_by in approvers or (self.key_name is not None and self.id in approvers)


BOOTSTRAP = Principal("bootstrap", EVERY_SCOPE)
ANONYMOUS = Principal("anonymous", EVERY_SCOPE)


def key_principal(key_id: str, name: str, scopes: frozenset[Scope]) -> Principal:
    return Principal(KEY_PREFIX + key_id, scopes, name)
