"""Principals (§34.5) and key tokens (§34.4): who decides as whom, and what names a key."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rebuno.kernel.domain.api_key import ApiKey, token_for, token_hash, token_key_id, verifies
from rebuno.kernel.domain.errors import Forbidden
from rebuno.kernel.domain.principal import ANONYMOUS, BOOTSTRAP, Principal, key_principal
from rebuno.protocol.enums import Scope

KEY_ID = "0192f3a4-0000-7000-8000-000000000001"
ALICE = key_principal(KEY_ID, "alice", frozenset({Scope.APPROVALS_WRITE}))


def test_a_key_decides_as_its_name_whatever_it_leaves_out() -> None:
    assert ALICE.decider("") == "alice"
    assert ALICE.decider("alice") == "alice"
    with pytest.raises(Forbidden):
        ALICE.decider("bob")


@pytest.mark.parametrize("trusted", [BOOTSTRAP, ANONYMOUS])
def test_the_bootstrap_token_and_dev_callers_name_the_person(trusted: Principal) -> None:
    assert trusted.decider("bob") == "bob"
    assert trusted.decider("") == ""


def test_approvers_admit_a_key_by_name_or_by_id() -> None:
    assert ALICE.may_approve(("alice",), "alice")
    assert ALICE.may_approve((f"key:{KEY_ID}",), "alice")
    assert not ALICE.may_approve(("bob",), "alice")
    # Only a scoped key is matched by id: the bootstrap token names a person instead.
    assert not BOOTSTRAP.may_approve(("bootstrap",), "")
    assert ALICE.may_approve(None, "alice") and ALICE.may_approve((), "alice")


def test_scopes_are_exact() -> None:
    ALICE.require(Scope.APPROVALS_WRITE)
    with pytest.raises(Forbidden):
        ALICE.require(Scope.APPROVALS_READ)  # write never implies read


def test_only_a_live_key_with_the_same_hash_verifies() -> None:
    token = token_for(KEY_ID, bytes(32))
    key = ApiKey(KEY_ID, "ci", (Scope.EXECUTIONS_READ,), token_hash(token), datetime.now(UTC))

    assert token_key_id(token) == KEY_ID
    assert verifies(key, token)
    assert not verifies(key, token_for(KEY_ID, bytes(31) + b"\x01"))
    assert token_key_id(token.replace(KEY_ID, KEY_ID.upper())) is None
    assert token_key_id(token[:-1]) is None and token_key_id("rbk_x.y") is None
