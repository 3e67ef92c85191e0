"""The SDK installs alone: `pip install rebuno` without extras runs `examples/hello_agent.py`
against a kernel, and its `rebuno` command says in one line what to install for the rest.
The project is built and installed into a fresh virtual environment (the build backend comes
from the package registry, as any user's install would get it)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from harness.ports import free_port
from harness.processes import ROOT, Kernel, Process

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def sdk_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a virtual environment holding `rebuno` without extras."""
    home = tmp_path_factory.mktemp("sdk-only")
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(ROOT)],
        check=True,
        timeout=540,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return python


def test_the_base_install_has_no_kernel_and_says_what_to_install(sdk_only: Path) -> None:
    probe = "import importlib.util as u; print(u.find_spec('starlette') is None)"
    absent = subprocess.run([str(sdk_only), "-c", probe], capture_output=True, text=True)
    cli = subprocess.run(
        [str(sdk_only.parent / "rebuno"), "version"], capture_output=True, text=True, timeout=60
    )

    assert absent.stdout.strip() == "True"
    assert cli.returncode == 2
    assert cli.stdout == ""
    assert cli.stderr.count("\n") == 1
    assert "pip install 'rebuno[kernel]'" in cli.stderr


def test_the_base_install_runs_the_hello_agent(sdk_only: Path, tmp_path: Path) -> None:
    agent_port = free_port()
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        "agents:\n  - id: hello\n"
        f"    webhook_url: http://127.0.0.1:{agent_port}/webhook\n"
        "    secret: hello-dev-secret\n"
    )
    kernel = Kernel(tmp_path / "kernel.db", manifest, tmp_path / "kernel.log")
    env = {"REBUNO_URL": kernel.url, "PORT": str(agent_port)}
    script = str(ROOT / "examples" / "hello_agent.py")
    agent = Process([str(sdk_only), script], tmp_path / "agent.log", env)
    try:
        created = kernel.post("/v0/executions", {"agent_id": "hello", "input": {"name": "Ada"}})
        done = kernel.wait_for_status(str(created["id"]), {"completed", "failed"}, 60)
    finally:
        agent.stop()
        kernel.stop()

    assert done["status"] == "completed", (done, agent.output())
    assert done["output"] == {"greeting": "Hello, Ada!", "letters": 8}
    assert sys.executable != str(sdk_only)
