"""`rebuno key create|ls|rotate|revoke` (§34.6) against a real `rebuno dev` kernel, each
command its own process; and `rebuno approvals grant` with a scoped key, which decides as the
key's name instead of `$USER` (§34.5)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.cli.conftest import Stack
from tests.cli.harness import rebuno
from tests.cli.test_commands import create, pending_approval, wait_for_status

TOKEN = re.compile(r"^rbk_[0-9a-f-]{36}\.[A-Za-z0-9_-]{43}$")


def key_json(stack: Stack, *args: str, api_key: str = "") -> Any:
    result = rebuno("key", *args, url=stack.url, env={"REBUNO_API_KEY": api_key})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and ": " not in result.stdout  # one compact line
    return json.loads(result.stdout)


def test_a_key_is_created_listed_rotated_and_revoked(stack: Stack) -> None:
    issued = key_json(stack, "create", "ci", "--scope", "executions:read,agents:read")
    rotated = key_json(stack, "rotate", issued["id"])
    revoked = rebuno("key", "revoke", issued["id"], url=stack.url)
    listed = key_json(stack, "list")

    assert issued["scopes"] == ["agents:read", "executions:read"]
    assert TOKEN.match(issued["token"]) and TOKEN.match(rotated["token"])
    assert rotated["id"] == issued["id"] and rotated["token"] != issued["token"]
    assert (revoked.returncode, revoked.stdout) == (0, "")
    [mine] = [key for key in listed if key["id"] == issued["id"]]
    assert "revoked_at" in mine and "token" not in mine
    assert issued["token"] not in json.dumps(listed)


def test_repeated_scopes_are_all_granted(stack: Stack) -> None:
    issued = key_json(stack, "create", "ops", "--scope", "approvals:read", "--scope", "agents:read")

    assert issued["scopes"] == ["agents:read", "approvals:read"]


def test_a_created_key_authenticates_the_cli_with_its_scopes(stack: Stack) -> None:
    reader = key_json(stack, "create", "reader", "--scope", "executions:read")["token"]

    listed = rebuno("exec", "ls", url=stack.url, env={"REBUNO_API_KEY": reader})
    refused = rebuno("key", "ls", "--api-key", reader, url=stack.url)
    assert listed.returncode == 0, listed.stderr
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    assert "(forbidden)" in refused.stderr


def test_kernel_refusals_are_one_line_errors(stack: Stack) -> None:
    no_scope = rebuno("key", "create", "nothing", url=stack.url)
    unknown = rebuno("key", "rotate", "0192d8c0-1234-7abc-8def-0123456789ad", url=stack.url)
    prefix = rebuno("key", "revoke", "0192d8c0", url=stack.url)

    for result, code in (
        (no_scope, "validation_error"),
        (unknown, "not_found"),
        (prefix, "not_found"),
    ):
        assert result.returncode == 1
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert f"({code})" in result.stderr and "Traceback" not in result.stderr


def test_a_scoped_key_grants_as_its_own_name_not_as_user(stack: Stack) -> None:
    token = key_json(stack, "create", "alice", "--scope", "approvals:write,approvals:read")["token"]
    execution_id = create(stack, "gated", '{"command": "id"}')
    approval = pending_approval(stack, execution_id)

    granted = rebuno(
        "approvals",
        "grant",
        approval["id"],
        url=stack.url,
        env={"REBUNO_API_KEY": token, "USER": "bob"},
    )

    assert granted.returncode == 0, granted.stderr
    wait_for_status(stack, execution_id, "completed")
    shown = rebuno("approvals", "get", approval["id"], "--json", url=stack.url)
    decided = json.loads(shown.stdout)
    assert decided["decided_by"] == "alice"
    assert decided["asserted_by"].startswith("key:")
