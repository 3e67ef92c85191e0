"""Browser tests of the console: Debian's Chromium driven by Playwright, against real
kernels (`rebuno dev`, `rebuno server`) with the real agents of `tests/cli/agent.py`.

One browser per worker and one kernel per mode per worker; each test gets a fresh browser
context (its own cookies). A failing test leaves a screenshot in `SCREENSHOT_DIR`. With
`REBUNO_CONSOLE_SHOTS` set to a directory, the tests that show a page worth documenting
save it there too (that is how the pictures in docs/console.md are made).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import wait_healthy
from tests.cli.conftest import AGENTS, GATED, Stack
from tests.cli.harness import Process, child_env, kernel_args, start_agent, write_manifest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR = ROOT / ".cache" / "console-failures"
TOKEN = "console-test-token-value"
WAIT_MS = 15_000
expect.set_options(timeout=WAIT_MS)  # a loaded machine is slow, never a reason to fail


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]  # pluggy's hookwrapper result
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


# Package scope, not session: while the sync API runs, its event loop counts as running in
# this thread, and an asyncio test that comes after the console's tests could not start one.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI: /usr/bin/chromium is required (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as running:
        yield running


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # `launch` gives each browser a fresh profile directory of its own.
    launched = playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )
    yield launched
    launched.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    try:
        yield opened
    finally:
        if request.node.stash.get(_FAILED, False):
            SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.nodeid)
            shot = SCREENSHOT_DIR / f"{name}.png"
            opened.screenshot(path=str(shot), full_page=True)
            print(f"screenshot of the failing page: {shot}")
        context.close()


def document(page: Page, name: str) -> None:
    """Saves the page as `<name>.png` for the docs, when `REBUNO_CONSOLE_SHOTS` asks."""
    directory = os.environ.get("REBUNO_CONSOLE_SHOTS")
    if directory:
        page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)


def _start_stack(directory: Path, agents: tuple[str, ...], *flags: str) -> Stack:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ports = {agent_id: free_port() for agent_id in agents}
    manifest = write_manifest(directory / "rebuno.yaml", ports, {"gated": GATED})
    args = kernel_args(port, directory / "kernel.db", manifest, *flags)
    if flags:  # `rebuno server`: the same options, bearer auth on, loopback webhooks allowed
        args[args.index("dev")] = "server"
    env = child_env({"REBUNO_WEBHOOK_ALLOW": "127.0.0.0/8"} if flags else None)
    running = Stack(url, directory, Process(args, directory / "kernel.log", env))
    try:
        wait_healthy(url, running.kernel)
        # The agents start side by side: each waits only for its own port.
        with ThreadPoolExecutor(len(ports)) as pool:
            started = {
                agent_id: pool.submit(
                    start_agent, agent_id, port, url, directory / f"{agent_id}.log"
                )
                for agent_id, port in ports.items()
            }
            for agent_id, future in started.items():
                running.agents[agent_id] = future.result()
    except BaseException:
        _stop(running)
        raise
    return running


def _stop(running: Stack) -> None:
    for agent in running.agents.values():
        agent.stop()
    running.kernel.stop()


@pytest.fixture(scope="session")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`rebuno dev` with the test agents, shared by every console test of a worker."""
    running = _start_stack(tmp_path_factory.mktemp("console-dev"), AGENTS)
    yield running
    _stop(running)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`rebuno server` (bearer token `TOKEN`) with the test agents."""
    directory = tmp_path_factory.mktemp("console-server")
    running = _start_stack(directory, ("gated",), "--bearer-token", TOKEN)
    yield running
    _stop(running)


def create(stack: Stack, agent_id: str, body: Any, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(
        f"{stack.url}/v0/executions",
        json={"agent_id": agent_id, "input": body},
        headers=headers,
        timeout=10,
    )
    response.raise_for_status()
    found: str = response.json()["id"]
    return found


def execution(stack: Stack, execution_id: str, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{stack.url}/v0/executions/{execution_id}", headers=headers, timeout=10)
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


def wait_for_status(stack: Stack, execution_id: str, status: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.update(execution(stack, execution_id))
        return bool(seen["status"] == status)

    poll_until(reached, 20, f"{execution_id} to be {status}")
    return seen
