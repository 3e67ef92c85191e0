"""Kernel logs: text or JSON lines carrying the ids of the request or delivery they concern,
and never a secret or a bearer token, checked on real kernel processes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import wait_healthy
from rebuno.cli.logs import JsonFormatter, TextFormatter, configure_logging
from tests.cli.harness import (
    CLI,
    SECRET,
    Process,
    child_env,
    kernel_args,
    rebuno,
    rebuno_json,
    start_agent,
    write_manifest,
)

TOKEN = "bearer-T0KEN-for-the-log-test"
OTHER_SECRET = "registered-0ver-the-api"


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    root, quiet = logging.getLogger(), logging.getLogger("httpx")
    handlers, level, httpx_level = list(root.handlers), root.level, quiet.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    quiet.setLevel(httpx_level)


def record(message: str, **extra: Any) -> logging.LogRecord:
    entry = logging.LogRecord("rebuno.kernel", logging.WARNING, "", 0, message, None, None)
    entry.__dict__.update(extra)
    return entry


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_text_lines_end_with_the_extra_fields_as_key_value_pairs() -> None:
    line = TextFormatter().format(record("delivery failed", execution_id="e-1", detail="a b"))

    assert line.endswith('WARNING rebuno.kernel: delivery failed detail="a b" execution_id=e-1')


def test_json_lines_carry_the_extra_fields_as_keys() -> None:
    entry = json.loads(JsonFormatter().format(record("delivery failed", dispatch_id="d-1")))

    assert entry["message"] == "delivery failed"
    assert (entry["level"], entry["logger"], entry["dispatch_id"]) == (
        "warning",
        "rebuno.kernel",
        "d-1",
    )


def test_per_request_httpx_lines_are_kept_for_debug() -> None:
    configure_logging("info", "text")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING

    configure_logging("debug", "json")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.DEBUG


def test_a_failed_delivery_is_logged_with_its_execution_and_dispatch_ids(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    manifest = write_manifest(tmp_path / "rebuno.yaml", {"greeter": free_port()}, {})
    args = kernel_args(port, tmp_path / "k.db", manifest, "--log-format", "json")
    kernel = Process(args, tmp_path / "kernel.log", child_env())
    try:
        wait_healthy(url, kernel)
        execution_id = rebuno_json("exec", "create", "greeter", "{}", url=url)["id"]

        def failure_logged() -> bool:
            return any("delivery failed" in e["message"] for e in json_lines(kernel.output()))

        poll_until(failure_logged, 20, "a failed delivery in the log")
    finally:
        kernel.stop()
    failed = next(e for e in json_lines(kernel.output()) if "delivery failed" in e["message"])
    assert failed["level"] == "warning"
    assert failed["execution_id"] == execution_id
    assert failed["dispatch_id"] in failed["message"]


def test_no_secret_or_bearer_token_reaches_the_log_of_a_server(tmp_path: Path) -> None:
    port, agent_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    manifest = write_manifest(tmp_path / "rebuno.yaml", {"greeter": agent_port}, {})
    args = [
        *CLI,
        "server",
        "--listen-addr",
        f"127.0.0.1:{port}",
        "--db-url",
        f"sqlite:///{tmp_path / 'k.db'}",
        "--bearer-token",
        TOKEN,
        "--config",
        str(manifest),
        "--log-level",
        "debug",
        "--log-format",
        "json",
    ]
    # The agent's webhook is on loopback, which a server refuses unless allowed.
    env = {**child_env(), "REBUNO_WEBHOOK_ALLOW": "127.0.0.0/8"}
    kernel = Process(args, tmp_path / "kernel.log", env)
    agent: Process | None = None
    try:
        wait_healthy(url, kernel)
        agent = start_agent("greeter", agent_port, url, tmp_path / "agent.log")
        exercise_the_api(url, tmp_path)
    finally:
        if agent is not None:
            agent.stop()
        kernel.stop()
    log = kernel.output()
    # Not an empty log: the delivery of the run above is there, at debug level.
    assert any(line["message"].startswith("delivered:") for line in json_lines(log)), log
    for secret in (TOKEN, SECRET, OTHER_SECRET):
        assert secret not in log
    assert "Bearer" not in log


def exercise_the_api(url: str, tmp_path: Path) -> None:
    """Authorised and refused client calls, a signed agent run, and an agent registration."""
    unauthorised = rebuno("exec", "ls", "--api-key", "wrong", url=url)
    assert unauthorised.returncode == 1
    assert unauthorised.stderr.rstrip().endswith("(unauthorized)")
    created = rebuno(
        "exec", "create", "greeter", '{"name": "ada"}', "--json", "--api-key", TOKEN, url=url
    )
    assert created.returncode == 0, created.stderr
    execution_id = json.loads(created.stdout)["id"]
    watched = rebuno("exec", "watch", execution_id, "--api-key", TOKEN, url=url)
    assert "status: completed" in watched.stdout, watched.stderr
    manifest = tmp_path / "other.yaml"
    write_manifest(manifest, {"other": 9}, {})
    manifest.write_text(manifest.read_text().replace(SECRET, OTHER_SECRET))
    added = rebuno("agents", "add", str(manifest), "--api-key", TOKEN, url=url)
    assert added.returncode == 0, added.stderr
