"""One-shot commands (`rebuno exec|agents|approvals ...`) against a real kernel process and
real agents; every command runs as its own process, as a script would run it."""

from __future__ import annotations

import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from tests.cli.conftest import Stack
from tests.cli.harness import CLI, child_env, rebuno, rebuno_json


def create(stack: Stack, agent_id: str, input_json: str) -> str:
    created = rebuno_json("exec", "create", agent_id, input_json, url=stack.url)
    assert created["status"] == "pending"
    execution_id: str = created["id"]
    return execution_id


def wait_for_status(stack: Stack, execution_id: str, status: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(rebuno_json("exec", "get", execution_id, url=stack.url))
        now: str = found["status"]
        return now == status

    poll_until(reached, 20, f"execution {execution_id} to be {status}")
    return found


def pending_approval(stack: Stack, execution_id: str) -> dict[str, Any]:
    wait_for_status(stack, execution_id, "blocked")
    approvals = rebuno_json("approvals", "ls", "--execution", execution_id, url=stack.url)
    assert len(approvals) == 1
    approval: dict[str, Any] = approvals[0]
    return approval


def test_agents_ls_lists_the_manifest_agents_with_their_policy_size(stack: Stack) -> None:
    result = rebuno("agents", "ls", url=stack.url)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "WEBHOOK", "POLICY"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["greeter"].endswith("none")
    assert rows["gated"].endswith("bytes")


def test_agents_get_shows_what_the_agent_published(stack: Stack) -> None:
    def published() -> bool:
        return "description" in rebuno_json("agents", "get", "greeter", url=stack.url)

    poll_until(published, 20, "the greeter to publish its metadata")
    shown = rebuno("agents", "get", "greeter", url=stack.url)

    assert "description: the greeter of the CLI tests" in shown.stdout
    assert "input schema:" in shown.stdout
    assert '    "name": {' in shown.stdout


def test_agents_add_get_and_rm_round_trip_a_manifest_agent(stack: Stack, tmp_path: Path) -> None:
    manifest = tmp_path / "more.yaml"
    manifest.write_text(
        "agents:\n"
        "  - id: temporary\n"
        "    webhook_url: http://127.0.0.1:9/webhook\n"
        "    secret: x\n"
        "    policy: |\n"
        "      default_action: deny\n"
    )

    added = rebuno("agents", "add", str(manifest), url=stack.url)
    shown = rebuno("agents", "get", "temporary", url=stack.url)
    removed = rebuno("agents", "rm", "temporary", url=stack.url)
    gone = rebuno("agents", "get", "temporary", url=stack.url)

    assert added.stdout.startswith("registered temporary (http://127.0.0.1:9/webhook")
    assert "webhook: http://127.0.0.1:9/webhook" in shown.stdout
    assert "  default_action: deny" in shown.stdout
    assert removed.stdout == "removed temporary\n"
    assert gone.returncode == 1
    assert gone.stderr.startswith("error: ") and gone.stderr.rstrip().endswith("(not_found)")


def test_agents_add_reports_a_bad_manifest_as_one_error_line(stack: Stack, tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text("agents:\n  - webhook_url: http://127.0.0.1:9/webhook\n")

    result = rebuno("agents", "add", str(manifest), url=stack.url)

    assert result.returncode == 1
    assert result.stderr == f"error: manifest {manifest}, line 2: agents[0]: id is required\n"


BAD_MANIFESTS = {
    "misspelt-webhook-url": (
        "agents:\n  - id: a\n    webhok_url: http://127.0.0.1:9/webhook\n    secret: s\n",
        "line 3: agents[0].webhok_url: unknown key (did you mean webhook_url?)",
    ),
    "misspelt-policy": (
        "agents:\n  - id: a\n    webhook_url: http://127.0.0.1:9/webhook\n    secret: s\n"
        "    polcy: |\n      default_action: deny\n",
        "line 5: agents[0].polcy: unknown key (did you mean policy?)",
    ),
    "unclosed-flow-sequence": (
        "agents: [\n",
        "line 2, column 1: invalid YAML: expected the node content, but found '<stream end>'"
        " (while parsing a flow node)",
    ),
}


@pytest.mark.parametrize("command", ["dev", "server"])
@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_a_kernel_given_a_bad_manifest_exits_1_with_one_line(
    tmp_path: Path, command: str, case: str
) -> None:
    text, message = BAD_MANIFESTS[case]
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(text)
    args = [*CLI, command, "--config", str(manifest), "--db-url", f"sqlite:///{tmp_path}/k.db"]
    args += [
        "--listen-addr",
        "127.0.0.1:0",
        *(["--bearer-token", "t"] if command == "server" else []),
    ]

    result = subprocess.run(args, capture_output=True, text=True, timeout=60, env=child_env())

    assert result.returncode == 1
    assert result.stderr == f"error: manifest {manifest}, {message}\n"


def test_exec_watch_by_prefix_follows_the_execution_to_completion(stack: Stack) -> None:
    execution_id = create(stack, "greeter", '{"name": "ada"}')

    watched = rebuno("exec", "watch", execution_id[:20], url=stack.url)

    assert watched.returncode == 0, watched.stderr
    assert "step.succeeded" in watched.stdout
    assert "execution.completed" in watched.stdout
    assert "status: completed" in watched.stdout
    assert 'output: {"greeting": "HELLO ADA"}' in watched.stdout


def test_exec_get_events_and_ls_print_json_for_scripts(stack: Stack) -> None:
    execution_id = create(stack, "greeter", '{"name": "bo"}')
    wait_for_status(stack, execution_id, "completed")

    execution = rebuno_json("exec", "get", execution_id, url=stack.url)
    events = rebuno_json("exec", "events", execution_id, url=stack.url)
    listed = rebuno_json("exec", "ls", "--agent", "greeter", "--status", "completed", url=stack.url)

    assert execution["output"] == {"greeting": "HELLO BO"}
    assert [event["event_seq"] for event in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "execution.created"
    assert events[-1]["type"] == "execution.completed"
    assert execution_id in {item["id"] for item in listed}
    assert {item["agent_id"] for item in listed} == {"greeter"}


def test_exec_create_reads_its_input_from_stdin(stack: Stack) -> None:
    result = rebuno(
        "exec", "create", "greeter", "-", "--json", url=stack.url, stdin='{"name": "cy"}'
    )

    assert result.returncode == 0, result.stderr
    assert '"name": "cy"' in result.stdout


def test_approvals_grant_by_an_approver_resumes_the_gated_execution(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "ls"}')
    approval = pending_approval(stack, execution_id)

    granted = rebuno("approvals", "grant", approval["id"][:24], "--by", "alice", url=stack.url)

    assert granted.returncode == 0, granted.stderr
    assert granted.stdout == f"granted {approval['id']}\n"
    done = wait_for_status(stack, execution_id, "completed")
    assert done["output"] == {"ran": "ran ls"}
    assert approval["message"] == "run a shell command?"


def test_approvals_deny_with_a_rationale_refuses_the_step(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "rm -rf /"}')
    approval = pending_approval(stack, execution_id)

    denied = rebuno(
        "approvals",
        "deny",
        approval["id"],
        "--by",
        "alice",
        "--rationale",
        "too risky",
        url=stack.url,
    )

    assert denied.returncode == 0, denied.stderr
    done = wait_for_status(stack, execution_id, "completed")
    assert "too risky" in done["output"]["ran"]
    decided = rebuno_json("approvals", "ls", "--status", "denied", url=stack.url)
    mine = next(item for item in decided if item["id"] == approval["id"])
    assert (mine["decided_by"], mine["rationale"]) == ("alice", "too risky")


def test_grant_by_someone_not_among_the_approvers_fails_with_exit_1(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "pwd"}')
    approval = pending_approval(stack, execution_id)

    refused = rebuno("approvals", "grant", approval["id"], "--by", "mallory", url=stack.url)

    assert refused.returncode == 1
    assert refused.stderr.startswith("error: ") and "(forbidden)" in refused.stderr
    assert rebuno_json("exec", "get", execution_id, url=stack.url)["status"] == "blocked"


def test_exec_cancel_ends_a_blocked_execution_and_a_second_cancel_fails(stack: Stack) -> None:
    execution_id = create(stack, "gated", '{"command": "whoami"}')
    pending_approval(stack, execution_id)

    cancelled = rebuno("exec", "cancel", execution_id, url=stack.url)
    again = rebuno("exec", "cancel", execution_id, url=stack.url)

    assert cancelled.stdout == f"cancelled {execution_id}\n"
    assert rebuno_json("exec", "get", execution_id, url=stack.url)["status"] == "cancelled"
    assert again.returncode == 1
    assert again.stderr == f"error: execution {execution_id} is already cancelled\n"


def test_exec_stream_prints_live_deltas_until_the_execution_ends(stack: Stack) -> None:
    execution_id = create(stack, "streamer", "{}")
    output = stack.directory / "stream.out"
    with output.open("w") as sink:
        streaming = subprocess.Popen(
            [*CLI, "exec", "stream", execution_id, "--url", stack.url],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        try:
            poll_until(lambda: "tick" in output.read_text(), 20, "the first delta")
            stack.open_gate()
            assert streaming.wait(30) == 0, output.read_text()
        finally:
            streaming.kill()
    assert wait_for_status(stack, execution_id, "completed")["status"] == "completed"
    assert output.read_text().rstrip().split()[-1].startswith("tick")


def test_an_unknown_id_prefix_is_one_error_line_with_exit_1(stack: Stack) -> None:
    result = rebuno("exec", "get", "ffffffff", url=stack.url)

    assert result.returncode == 1
    assert result.stderr == "error: no execution id starts with 'ffffffff'\n"


def test_invalid_json_input_is_a_usage_error(stack: Stack) -> None:
    result = rebuno("exec", "create", "greeter", "{not json", url=stack.url)

    assert result.returncode == 2
    assert result.stderr.startswith("error: the input is not valid JSON")


def test_an_unreachable_kernel_is_one_error_line_with_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = rebuno("agents", "ls", url=url)

    assert result.returncode == 1
    assert result.stderr.startswith(f"error: cannot reach the kernel at {url}: ")
    assert "Connect call failed" in result.stderr or "refused" in result.stderr.lower()
    assert len(result.stderr.splitlines()) == 1


def test_a_url_without_a_scheme_is_named_in_one_line() -> None:
    result = rebuno("agents", "ls", url="127.0.0.1:8080")

    assert result.returncode == 1
    assert result.stderr == (
        "error: --url: URL '127.0.0.1:8080' is not an http:// or https:// URL\n"
    )


def test_a_server_that_is_no_kernel_is_named_as_such() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)  # answers 404 HTML
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = rebuno("agents", "ls", url=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()

    assert result.returncode == 1
    assert "without a Rebuno error envelope: is --url the kernel's?" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_second_dev_kernel_on_the_same_file_refuses_naming_the_holder(stack: Stack) -> None:
    database = stack.directory / "kernel.db"
    args = [*CLI, "dev", "--db-url", f"sqlite:///{database}"]
    args += ["--listen-addr", f"127.0.0.1:{free_port()}"]

    second = subprocess.run(args, capture_output=True, text=True, timeout=60, env=child_env())

    assert second.returncode == 1
    assert second.stderr == (
        f"error: SQLite database {database} is in use by process {stack.kernel.proc.pid}: one"
        " kernel per file (stop the other, or give this one its own --db-url)\n"
    )
