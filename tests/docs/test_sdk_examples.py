"""The examples of docs/sdk.md that serve an agent no shipped manifest registers, run as
written: the conversation of its Conversations section, on a kernel whose manifest registers
its agent, with the example's base URL and port replaced by the test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import Kernel, Process
from tests.docs.blocks import blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PYTHON_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"


def conversation_example() -> str:
    (found,) = [b for b in blocks("docs/sdk.md") if 'Agent("chat"' in b.text]
    return found.text


def test_the_conversation_example_carries_state_from_turn_to_turn(tmp_path: Path) -> None:
    port = free_port()
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        "agents:\n"
        "  - id: chat\n"
        f"    webhook_url: http://127.0.0.1:{port}/webhook\n"
        "    secret: chat-dev-secret\n"
    )
    kernel = Kernel(tmp_path / "kernel.db", manifest, tmp_path / "kernel.log")
    script = tmp_path / "chat_agent.py"
    script.write_text(
        conversation_example()
        .replace("http://127.0.0.1:8080", kernel.url)
        .replace("port=5003", f"port={port}")
    )
    agent = Process([str(PYTHON_BIN), str(script)], tmp_path / "agent.log")
    try:
        turns = []
        for message in ("hi", "again"):
            created = kernel.post(
                "/v0/executions",
                {"agent_id": "chat", "input": {"message": message}, "session": "docs"},
            )
            turns.append(created["id"])
        poll_until(
            lambda: all(kernel.get(f"/v0/executions/{t}")["status"] == "completed" for t in turns),
            60,
            f"both turns to complete\n{agent.output()}",
        )
        outputs = [kernel.get(f"/v0/executions/{t}")["output"] for t in turns]
    finally:
        agent.stop()
        kernel.stop()

    assert outputs == [{"reply": "HI", "turns": 1}, {"reply": "AGAIN", "turns": 2}]
