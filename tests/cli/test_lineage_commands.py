"""The CLI's sessions, forks and idempotent creates (docs/protocol.md §24-§27) against a real
kernel process and real agents: `exec create --session/--parent/--idempotency-key/
--on-behalf-of`, `exec ls --session`, `exec fork`, what `exec get` shows of an execution's
origin, the exit code of `exec watch`, and the reference CLI's spellings (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Stack
from tests.cli.harness import rebuno, rebuno_json
from tests.cli.test_commands import create, pending_approval, wait_for_status


def test_turns_of_a_session_are_listed_and_continue_one_another(stack: Stack) -> None:
    first = rebuno_json(
        "exec", "create", "greeter", '{"name": "ada"}', "--session", "talk-1", url=stack.url
    )
    wait_for_status(stack, first["id"], "completed")
    second = rebuno_json(
        "exec",
        "create",
        "greeter",
        '{"name": "bo"}',
        "--session",
        "talk-1",
        "--on-behalf-of",
        "user:7",
        url=stack.url,
    )
    wait_for_status(stack, second["id"], "completed")

    listed = rebuno_json("exec", "ls", "--session", "talk-1", url=stack.url)
    shown = rebuno("exec", "get", second["id"], url=stack.url)

    assert [e["id"] for e in listed] == [second["id"], first["id"]]
    assert shown.returncode == 0, shown.stderr
    assert "session: talk-1" in shown.stdout
    assert f"parent: {first['id']}" in shown.stdout
    assert "on behalf of: user:7" in shown.stdout
    assert "created by: anonymous" in shown.stdout


def test_exec_create_names_the_execution_by_its_short_id(stack: Stack) -> None:
    created = rebuno(
        "exec", "create", "greeter", '{"name": "fay"}', "--session", "s-9", url=stack.url
    )

    assert created.returncode == 0, created.stderr
    short = created.stdout.split()[1]
    assert len(short) == 18
    assert created.stdout.splitlines()[0] == (
        f"created {short} (pending); follow with 'rebuno exec watch {short}'"
    )
    assert wait_for_status(stack, short, "completed")["id"].startswith(short)


def test_an_idempotency_key_makes_one_execution(stack: Stack) -> None:
    first = rebuno_json(
        "exec", "create", "greeter", '{"name": "cy"}', "--idempotency-key", "k-1", url=stack.url
    )
    again = rebuno_json(
        "exec", "create", "greeter", '{"name": "dee"}', "--idempotency-key", "k-1", url=stack.url
    )
    assert again["id"] == first["id"]
    assert again["input"] == {"name": "cy"}


def test_exec_fork_reruns_from_an_event(stack: Stack, tmp_path: Path) -> None:
    source = rebuno_json("exec", "create", "greeter", '{"name": "eve"}', url=stack.url)
    wait_for_status(stack, source["id"], "completed")

    forked = rebuno("exec", "fork", source["id"][:20], "--at", "2", url=stack.url)
    assert forked.returncode == 0, forked.stderr
    fork_id = forked.stdout.split()[1]
    assert forked.stdout == (
        f"forked {fork_id} from {source['id'][:18]} at 2;"
        f" follow with 'rebuno exec watch {fork_id}'\n"
    )
    assert len(fork_id) == 18
    done = wait_for_status(stack, fork_id, "completed")
    assert done["forked_from"] == source["id"]
    assert done["fork_seq"] == 2
    assert "forked from" in rebuno("exec", "get", fork_id, url=stack.url).stdout

    missing = rebuno("exec", "fork", source["id"], url=stack.url)
    assert missing.returncode == 2  # --at is required; nothing was sent
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: 7\n")
    refused = rebuno("exec", "fork", source["id"], "--at", "2", "--policy", str(bad), url=stack.url)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error:")


def test_exec_watch_exits_1_when_the_execution_failed(stack: Stack) -> None:
    failed = rebuno_json("exec", "create", "greeter", '{"wrong": 1}', url=stack.url)

    watched = rebuno("exec", "watch", failed["id"], url=stack.url)

    assert watched.returncode == 1, watched.stdout
    assert "failed" in watched.stdout


def test_the_reference_spellings_answer_as_ours(stack: Stack) -> None:
    assert (
        rebuno("agent", "list", url=stack.url).stdout
        == rebuno("agents", "ls", url=stack.url).stdout
    )
    assert rebuno("exec", "list", "--limit", "1", url=stack.url).returncode == 0
    execution_id = create(stack, "gated", '{"command": "rm -rf /"}')
    approval = pending_approval(stack, execution_id)

    nobody = rebuno(
        "approval", "deny", approval["id"], "--reason", "no", url=stack.url, env={"USER": ""}
    )
    assert nobody.returncode == 1
    assert nobody.stderr.strip() == "error: --by is required when $USER is unset"
    denied = rebuno(
        "approval",
        "deny",
        approval["id"],
        "--reason",
        "change freeze",
        url=stack.url,
        env={"USER": "alice"},
    )
    assert denied.returncode == 0, denied.stderr
    shown = rebuno_json("approval", "get", approval["id"], url=stack.url)
    assert (shown["decided_by"], shown["rationale"]) == ("alice", "change freeze")
