"""What a person deciding an approval or reading a run sees: `approvals ls` and `approval get`
with the gated step's kind, target and arguments, `exec steps` and `exec step` with
arguments, results and errors, and `exec watch` naming the approval a blocked run waits on.
Each command runs as its own process against a real kernel and real agents."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx

from harness.polling import poll_until
from tests.cli.conftest import Stack
from tests.cli.harness import CLI, child_env, rebuno, rebuno_json

# The runs are set up and decided over HTTP, so that only the command under test is a process.


def create(stack: Stack, agent_id: str, input_json: str) -> str:
    body = {"agent_id": agent_id, "input": json.loads(input_json)}
    created = httpx.post(f"{stack.url}/v0/executions", json=body, timeout=10)
    assert created.status_code == 201, created.text
    execution_id: str = created.json()["id"]
    return execution_id


def wait_for_status(stack: Stack, execution_id: str, status: str) -> None:
    def reached() -> bool:
        found = httpx.get(f"{stack.url}/v0/executions/{execution_id}", timeout=10).json()
        return bool(found["status"] == status)

    poll_until(reached, 30, f"execution {execution_id} to be {status}")


def pending_approval(stack: Stack, execution_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def requested() -> bool:
        query = {"execution_id": execution_id}
        found[:] = httpx.get(f"{stack.url}/v0/approvals", params=query, timeout=10).json()
        return bool(found)

    poll_until(requested, 30, f"the approval of {execution_id}")
    wait_for_status(stack, execution_id, "blocked")
    return found[0]


def deny(stack: Stack, approval: dict[str, Any]) -> None:
    body = {"decided_by": "alice", "rationale": "no"}
    url = f"{stack.url}/v0/approvals/{approval['id']}/deny"
    assert httpx.post(url, json=body, timeout=10).status_code == 204


def grant(stack: Stack, approval: dict[str, Any]) -> None:
    url = f"{stack.url}/v0/approvals/{approval['id']}/grant"
    assert httpx.post(url, json={"decided_by": "alice"}, timeout=10).status_code == 204


def row_of(output: str, ident: str) -> str:
    """The one table row that starts with a prefix of `ident`."""
    rows = [line for line in output.splitlines() if ident.startswith(line.split(" ", 1)[0])]
    assert len(rows) == 1, output
    return rows[0]


def test_approvals_ls_shows_the_gated_steps_kind_target_and_arguments(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "ls /srv"}')
    approval = pending_approval(stack, execution_id)

    listed = rebuno("approvals", "ls", "--execution", execution_id, url=stack.url)

    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        "ID", "EXECUTION", "STATUS", "KIND", "TARGET", "ARGUMENTS", "APPROVERS", "AGE"
    ]  # fmt: skip
    assert row_of(listed.stdout, approval["id"]) == row
    assert row.split()[2:5] == ["pending", "tool_call", "shell_exec"]
    assert '{"command": "ls /srv"}' in row
    assert row.split()[-2] == "alice"


def test_approvals_ls_summarises_long_arguments_on_one_bounded_line(stack: Stack) -> None:
    command = "echo start\n" + "x" * 500 + "\necho end"
    execution_id = create(stack, "gated", json.dumps({"command": command}))
    pending_approval(stack, execution_id)

    listed = rebuno("approvals", "ls", "--execution", execution_id, url=stack.url)

    lines = listed.stdout.splitlines()
    assert len(lines) == 2, listed.stdout
    summary = lines[1].split("shell_exec", 1)[1].split("…", 1)[0].strip() + "…"
    assert summary.startswith('{"command": "echo start\\nxxx')
    assert len(summary) == 60
    assert "echo end" not in lines[1]


def test_approvals_ls_json_carries_each_approvals_step(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "uname -a"}')
    approval = pending_approval(stack, execution_id)

    listed = rebuno_json("approvals", "ls", "--execution", execution_id, url=stack.url)

    (item,) = listed
    assert item["id"] == approval["id"]
    assert item["message"] == "run a shell command?"
    assert item["step"]["step_id"] == item["step_id"]
    step = item["step"]
    assert (step["kind"], step["target"], step["status"]) == (
        "tool_call", "shell_exec", "awaiting_approval"
    )  # fmt: skip
    assert step["args"] == {"command": "uname -a"}


def test_approval_get_shows_the_step_arguments_rule_approvers_and_expiry(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "df -h"}')
    approval = pending_approval(stack, execution_id)

    shown = rebuno("approval", "get", approval["id"][:24], url=stack.url)

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    fields = dict(line.split(": ", 1) for line in lines if ": " in line and line[0] != " ")
    assert fields["id"] == approval["id"]
    assert fields["status"] == "pending"
    assert fields["execution"] == execution_id
    assert fields["step"] == approval["step_id"]
    assert (fields["kind"], fields["target"]) == ("tool_call", "shell_exec")
    assert fields["rule"] == "review-shell"
    assert fields["approvers"] == "alice"
    assert fields["message"] == "run a shell command?"
    assert fields["expires"].startswith(approval["timeout_at"]) and "(in " in fields["expires"]
    arguments = lines[lines.index("arguments:") + 1 :]
    assert json.loads("\n".join(arguments)) == {"command": "df -h"}
    assert arguments[1] == '    "command": "df -h"'


def test_approval_get_json_adds_the_rule_and_the_step(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "id"}')
    approval = pending_approval(stack, execution_id)
    deny(stack, approval)

    shown = rebuno_json("approvals", "get", approval["id"], url=stack.url)

    assert shown["status"] == "denied"
    assert (shown["decided_by"], shown["rationale"]) == ("alice", "no")
    assert shown["rule_id"] == "review-shell"
    assert shown["step"]["args"] == {"command": "id"}
    assert shown["step"]["status"] == "denied"


def test_approval_get_of_an_unknown_id_is_one_error_line(stack: Stack) -> None:
    result = rebuno("approval", "get", "ffffffff", url=stack.url)

    assert result.returncode == 1
    assert result.stderr == "error: no approval id starts with 'ffffffff'\n"


def test_exec_steps_lists_arguments_and_results(stack: Stack) -> None:
    execution_id = create(stack, "greeter", '{"name": "di"}')
    wait_for_status(stack, execution_id, "completed")

    listed = rebuno("exec", "steps", execution_id[:20], url=stack.url)
    as_json = rebuno_json("exec", "steps", execution_id, url=stack.url)

    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["STEP", "KIND", "TARGET", "STATUS", "ARGUMENTS", "OUTCOME"]
    assert row.split()[1:4] == ["tool_call", "shout", "succeeded"]
    assert row.endswith('{"text": "hello di"}  HELLO DI')
    (step,) = as_json
    assert as_json[0]["step_id"].startswith(row.split()[0])
    assert (step["args"], step["result"]) == ({"text": "hello di"}, "HELLO DI")


def test_exec_step_by_prefix_shows_a_denied_steps_arguments_and_error(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "reboot"}')
    approval = pending_approval(stack, execution_id)
    deny(stack, approval)
    wait_for_status(stack, execution_id, "completed")

    shown = rebuno("exec", "step", execution_id, approval["step_id"][:10], url=stack.url)
    as_json = rebuno_json("exec", "step", execution_id, approval["step_id"], url=stack.url)

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert f"step: {approval['step_id']}" in lines
    assert "status: denied" in lines
    assert f"approval: {approval['id']} (denied)" in lines
    assert lines[lines.index("arguments:") + 2] == '    "command": "reboot"'
    assert "error:" in lines
    assert as_json["args"] == {"command": "reboot"}
    assert as_json["error"]["reason"]


def test_exec_step_with_an_unknown_step_prefix_is_one_error_line(stack: Stack) -> None:
    execution_id = create(stack, "greeter", '{"name": "ed"}')
    wait_for_status(stack, execution_id, "completed")

    result = rebuno("exec", "step", execution_id, "zz", url=stack.url)

    assert result.returncode == 1
    assert result.stderr == "error: no step id starts with 'zz'\n"


def test_exec_watch_on_a_blocked_run_names_the_approval_to_decide(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "make"}')
    output = stack.directory / "watch.out"
    with output.open("w") as sink:
        watching = subprocess.Popen(
            [*CLI, "exec", "watch", execution_id, "--url", stack.url],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        try:
            poll_until(lambda: "waiting on approval" in output.read_text(), 20, "the hint")
            approval = pending_approval(stack, execution_id)
            grant(stack, approval)
            assert watching.wait(30) == 0, output.read_text()
        finally:
            watching.kill()
    text = output.read_text()
    hint = f"waiting on approval {approval['id']} for shell_exec:"
    assert hint in text
    assert f"approvals get {approval['id']}, then grant or deny it" in text
    assert text.count("waiting on approval") == 1
    assert "status: completed" in text


def test_exec_watch_of_a_decided_run_names_no_approval(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "true"}')
    approval = pending_approval(stack, execution_id)
    grant(stack, approval)
    wait_for_status(stack, execution_id, "completed")

    watched = rebuno("exec", "watch", execution_id, url=stack.url)

    assert "approval.granted" in watched.stdout
    assert "waiting on approval" not in watched.stdout
