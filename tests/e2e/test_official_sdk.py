"""The official Rebuno Python SDK (installed from the registry in its own environment, since
it shares our import name) runs an agent against `rebuno dev` unchanged: two tool calls, a
crash inside the second, re-dispatch, replay of the first, completion. Its models also read
what this kernel's lists send when they leave large payloads out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, ROOT, Kernel, Process, Server
from tests.e2e.compat import official_sdk_python

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

AGENT_SCRIPT = ROOT / "tests" / "e2e" / "official_agent.py"
CLIENT_SCRIPT = ROOT / "tests" / "e2e" / "official_client.py"


def manifest(tmp_path: Path, agent_port: int) -> Path:
    path = tmp_path / "rebuno.yaml"
    path.write_text(
        "agents:\n"
        "  - id: compat\n"
        f"    webhook_url: http://127.0.0.1:{agent_port}/webhook\n"
        "    secret: compat-secret\n"
    )
    return path


@pytest.mark.parametrize("version", ["0.16.0", "0.29.2"])
def test_official_sdk_runs_through_redispatch_and_replay(tmp_path: Path, version: str) -> None:
    python = official_sdk_python(version)
    agent_port = free_port()
    side = tmp_path / "side.txt"
    side.touch()
    env = {"SIDE_FILE": str(side), "CRASH_IN_SECOND": str(tmp_path / "crashed")}
    kernel = Kernel(
        tmp_path / "kernel.db",
        manifest(tmp_path, agent_port),
        tmp_path / "kernel.log",
        env=FAST_RECOVERY,
    )
    args = [str(python), str(AGENT_SCRIPT), kernel.url, str(agent_port)]
    agent = Process(args, tmp_path / "agent-1.log", env)
    try:
        created = kernel.post("/v0/executions", {"agent_id": "compat", "input": {"topic": "x"}})
        execution_id = created["id"]
        poll_until(lambda: agent.proc.poll() is not None, 60, f"the crash\n{agent.output()}")
        agent.stop()
        agent = Process(args, tmp_path / "agent-2.log", env)

        done = kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)
    finally:
        agent.stop()
        kernel.stop()

    assert done["status"] == "completed", (done, agent.output(), kernel.output())
    assert done["output"] == {"summary": "2 results", "topic": "x"}
    assert side.read_text().split() == ["first", "second", "second"]


CHAT_SCRIPT = ROOT / "tests" / "e2e" / "official_chat.py"


def test_official_sdk_holds_a_conversation_in_a_session(tmp_path: Path) -> None:
    """SDK 0.29.2's sessions, idempotent create, `Result(output, state)` and `previous()`:
    the turns run one at a time, each reading the state the one before it left."""
    python = official_sdk_python("0.29.2")
    agent_port = free_port()
    path = tmp_path / "rebuno.yaml"
    path.write_text(
        "agents:\n"
        "  - id: chat\n"
        f"    webhook_url: http://127.0.0.1:{agent_port}/webhook\n"
        "    secret: chat-secret\n"
    )
    kernel = Kernel(tmp_path / "kernel.db", path, tmp_path / "kernel.log")
    agent = Process(
        [str(python), str(CHAT_SCRIPT), "agent", kernel.url, str(agent_port)],
        tmp_path / "agent.log",
    )
    try:
        created = subprocess.run(
            [str(python), str(CHAT_SCRIPT), "create", kernel.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        ids = json.loads(created.stdout)
        for execution_id in ids:
            kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)
        read = subprocess.run(
            [str(python), str(CHAT_SCRIPT), "read", kernel.url, *ids],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        agent.stop()
        kernel.stop()

    assert read.returncode == 0, read.stderr
    turns = json.loads(read.stdout)
    assert [t["output"] for t in turns] == [
        {"reply": "HI", "turns": 1},
        {"reply": "HOW", "turns": 2},
        {"reply": "BYE", "turns": 3},
    ], (agent.output(), kernel.output())
    assert [t["session"] for t in turns] == ["talk"] * 3
    assert turns[0]["idempotency_key"] == "turn-1"
    assert [t["parent_execution_id"] for t in turns[1:]] == [ids[0], ids[1]]
    assert {t["created_by"] for t in turns} == {"anonymous"}


def test_official_sdk_runs_a_sub_agent(tmp_path: Path) -> None:
    """SDK 0.29.2's `subagent()`: a tool creates the child, suspends, and after the child
    completes the rerun replays the step with the child's output."""
    python = official_sdk_python("0.29.2")
    ports = {name: free_port() for name in ("parent", "child")}
    path = tmp_path / "rebuno.yaml"
    path.write_text(
        "agents:\n"
        + "".join(
            f"  - id: {name}\n"
            f"    webhook_url: http://127.0.0.1:{port}/webhook\n"
            "    secret: chat-secret\n"
            for name, port in ports.items()
        )
    )
    kernel = Kernel(tmp_path / "kernel.db", path, tmp_path / "kernel.log")
    agents = [
        Process(
            [str(python), str(CHAT_SCRIPT), "agent", kernel.url, str(port), name],
            tmp_path / f"{name}.log",
            {"REBUNO_URL": kernel.url},
        )
        for name, port in ports.items()
    ]
    try:
        created = kernel.post("/v0/executions", {"agent_id": "parent", "input": {"topic": "x"}})
        done = kernel.wait_for_status(created["id"], {"completed", "failed"}, 60)
        events = kernel.get(f"/v0/executions/{created['id']}/events")
    finally:
        for agent in agents:
            agent.stop()
        kernel.stop()

    assert done["status"] == "completed", (done, [a.output() for a in agents], kernel.output())
    assert done["output"] == {"report": {"found": "X"}}
    types = [event["type"] for event in events]
    assert "execution.blocked" in types
    assert types.count("execution.resumed") == 1


@pytest.mark.parametrize("version", ["0.16.0", "0.29.2"])
def test_official_sdk_reads_a_step_list_item_whose_payloads_were_left_out(version: str) -> None:
    # What `GET …/steps` sends for a step whose args and result are over the list's limit.
    item = {
        "step_id": "a" * 64,
        "execution_id": "01a2",
        "kind": "tool_call",
        "target": "web_search",
        "args_hash": "b" * 64,
        "occurrence": 0,
        "status": "succeeded",
        "idempotency": "safe_to_retry",
        "omitted": {"args": 70000, "result": 200000},
    }
    script = (
        "import json, sys\n"
        "from rebuno.types import Step\n"
        "step = Step.model_validate(json.loads(sys.argv[1]))\n"
        "print(step.status, step.args, step.result)\n"
    )
    python = official_sdk_python(version)
    done = subprocess.run(
        [str(python), "-c", script, json.dumps(item)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["succeeded", "None", "None"]


@pytest.mark.parametrize("version", ["0.16.0", "0.29.2"])
def test_official_client_works_with_the_bootstrap_token_and_scoped_keys(
    tmp_path: Path, version: str
) -> None:
    # docs/protocol.md §34.1: the configured token stays the bootstrap key; a scoped key is
    # just another bearer token to the SDK, refused with the errors it already knows.
    python = official_sdk_python(version)
    db_url = f"sqlite:///{tmp_path / 'kernel.db'}"
    server = Server(
        db_url, "bootstrap-token", tmp_path / "kernel.log", manifest=manifest(tmp_path, 9)
    )
    try:
        issued = server.post("/v0/api-keys", {"name": "reader", "scopes": ["executions:read"]})
        args = [str(python), str(CLIENT_SCRIPT), server.url, "bootstrap-token", issued["token"]]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    finally:
        server.stop()

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "bootstrap True bootstrap",
        "reader-get True",
        "reader-create forbidden",
        "stranger unauthorized",
    ]
