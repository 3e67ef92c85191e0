"""This SDK in real processes: `rebuno dev` and an agent served by `Agent.run()`. The agent is
killed with SIGKILL after a tool body ran but before its result was recorded; after the lease
expires the kernel redelivers to a restarted agent."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from harness.llm_provider import FakeProvider
from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, ROOT, Kernel, Process

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

AGENT_SCRIPT = ROOT / "tests" / "sdk" / "e2e_agent.py"
SECRET = "e2e-secret"


class Setup:
    def __init__(self, tmp_path: Path, agent_id: str, extra_env: dict[str, str]) -> None:
        self.tmp_path, self.agent_id = tmp_path, agent_id
        self.port = free_port()
        self.side = tmp_path / "side.txt"
        self.side.touch()
        manifest = tmp_path / "rebuno.yaml"
        manifest.write_text(
            f"agents:\n  - id: {agent_id}\n"
            f"    webhook_url: http://127.0.0.1:{self.port}/webhook\n"
            f"    secret: {SECRET}\n"
        )
        self.kernel = Kernel(
            tmp_path / "kernel.db", manifest, tmp_path / "kernel.log", FAST_RECOVERY
        )
        self.env = {
            "REBUNO_URL": self.kernel.url,
            "REBUNO_AGENT_SECRET": SECRET,
            "PORT": str(self.port),
            "SIDE_FILE": str(self.side),
            "AGENT_ID": agent_id,
            **extra_env,
        }
        self.agents: list[Process] = []

    def start_agent(self, **env: str) -> Process:
        log = self.tmp_path / f"agent-{len(self.agents) + 1}.log"
        agent = Process([sys.executable, str(AGENT_SCRIPT)], log, {**self.env, **env})
        self.agents.append(agent)
        return agent

    def lines(self) -> list[str]:
        return self.side.read_text().splitlines()

    def logs(self) -> str:
        return "\n".join(a.output() for a in self.agents) + self.kernel.output()

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.kernel.stop()


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Setup]:
    setup = Setup(tmp_path, "shop", {})
    yield setup
    setup.close()


def _run(setup: Setup, input: object) -> str:
    created = setup.kernel.post("/v0/executions", {"agent_id": setup.agent_id, "input": input})
    return str(created["id"])


def _crash_and_restart(setup: Setup, first: Process, ran: str) -> None:
    poll_until(lambda: ran in setup.lines(), 30, f"{ran} to run\n{setup.logs()}")
    first.kill()
    setup.start_agent()


def test_happy_path_with_two_tools(shop: Setup) -> None:
    shop.start_agent()

    execution_id = _run(shop, {"item": "tea"})
    done = shop.kernel.wait_for_status(execution_id, {"completed", "failed"}, 30)

    assert done["output"] == {"fetched": "fetched tea", "charged": "charged tea"}, shop.logs()
    assert shop.lines() == ["fetch", "charge"]


def test_safe_to_retry_tool_runs_again_after_a_crash_before_its_result(shop: Setup) -> None:
    first = shop.start_agent(HANG_IN="fetch")
    execution_id = _run(shop, {"item": "tea"})

    _crash_and_restart(shop, first, "fetch")
    done = shop.kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)

    assert done["output"] == {"fetched": "fetched tea", "charged": "charged tea"}, shop.logs()
    assert shop.lines() == ["fetch", "fetch", "charge"]


def test_at_most_once_tool_is_indeterminate_and_never_runs_twice(shop: Setup) -> None:
    first = shop.start_agent(HANG_IN="charge")
    execution_id = _run(shop, {"item": "tea"})

    _crash_and_restart(shop, first, "charge")
    done = shop.kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)

    assert done["status"] == "completed", shop.logs()
    assert done["output"]["fetched"] == "fetched tea"
    assert done["output"]["charged"].startswith("unknown: outcome unknown")
    # The completed fetch replayed; the interrupted charge never ran a second time.
    assert shop.lines() == ["fetch", "charge"]


@pytest.fixture
def provider() -> Iterator[tuple[FakeProvider, str]]:
    fake = FakeProvider()
    port = free_port()
    config = uvicorn.Config(fake, host="127.0.0.1", port=port, log_level="warning", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="fake-provider", daemon=True)
    thread.start()
    poll_until(lambda: server.started, 10, "the fake provider")
    yield fake, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(10)


def test_openai_call_is_replayed_after_a_forced_redispatch(
    tmp_path: Path, provider: tuple[FakeProvider, str]
) -> None:
    fake, url = provider
    setup = Setup(tmp_path, "ask", {"PROVIDER_URL": url})
    try:
        first = setup.start_agent(HANG_IN="after-llm")
        execution_id = _run(setup, {"question": "why?"})
        _crash_and_restart(setup, first, "after-llm")
        done = setup.kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)
    finally:
        setup.close()

    assert done["output"] == {"answer": "reply #1 to why?"}, setup.logs()
    assert len(fake.calls) == 1
    replies = [json.loads(line) for line in setup.lines() if line.startswith("{")]
    assert len(replies) == 2 and replies[0] == replies[1]
