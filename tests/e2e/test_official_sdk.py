"""The official Rebuno Python SDK (installed from the registry in its own environment, since
it shares our import name) runs an agent against `rebuno dev` unchanged: two tool calls, a
crash inside the second, re-dispatch, replay of the first, completion. Its models also read
what this kernel's lists send when they leave large payloads out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.processes import (
    FAST_RECOVERY,
    ROOT,
    Kernel,
    Process,
    free_port,
    official_sdk_python,
)
from tests.support import poll_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

AGENT_SCRIPT = ROOT / "tests" / "e2e" / "official_agent.py"


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
