"""How long the kernel takes to answer the console's executions list with many executions
in the store (§40.4): fills an SQLite file through the service layer, then times the
requests the list page makes against a real `rebuno dev` on loopback.

    .venv/bin/python -m bench.console_list --executions 100000 --requests 50

Each execution is created and then cancelled, so the dispatch loop has nothing to deliver
while the requests are timed. Prints the median and the 90th percentile of each request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from harness.ports import free_port
from harness.processes import Process, wait_healthy
from rebuno.kernel.config import Settings
from rebuno.kernel.server import open_store
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.stream.memory import MemoryBus

AGENTS = ("alpha", "beta")
BATCH = 200


async def fill(db: Path, count: int) -> None:
    settings = Settings(dev=True, db_url=f"sqlite:///{db}")
    store = open_store(settings)
    await store.open()
    kernel = Kernel(store, settings, bus=MemoryBus())
    for agent in AGENTS:
        await kernel.register_agent(agent, "http://127.0.0.1:9/webhook", "secret", None, None)
    started = time.monotonic()
    for first in range(0, count, BATCH):
        made = await asyncio.gather(
            *(
                kernel.create_execution(AGENTS[n % 2], f'{{"n":{n}}}', None)
                for n in range(first, min(count, first + BATCH))
            )
        )
        await asyncio.gather(*(kernel.cancel_execution(one.id) for one in made[1::3]))
    await store.close()
    print(f"filled {count} executions in {time.monotonic() - started:.0f} s", file=sys.stderr)


def timed(url: str, params: dict[str, str], requests: int) -> tuple[float, float]:
    took = []
    with httpx.Client(base_url=url, timeout=30) as http:
        http.get("/v0/executions", params=params).raise_for_status()  # warm
        for _ in range(requests):
            started = time.perf_counter()
            http.get("/v0/executions", params=params).raise_for_status()
            took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.9) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        db = Path(directory) / "list.db"
        asyncio.run(fill(db, args.executions))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "rebuno.cli.main", "dev", "--db-url", f"sqlite:///{db}"]
        kernel = Process(
            [*command, "--listen-addr", f"127.0.0.1:{port}"], Path(directory) / "k.log"
        )
        try:
            wait_healthy(url)
            newest = httpx.get(f"{url}/v0/executions", params={"limit": "1"}).json()
            some = newest["executions"][0]["id"]
            cases = {
                "first page": {"limit": "50"},
                "agent and status": {"agent_id": "beta", "status": "cancelled", "limit": "50"},
                "id prefix": {"id_prefix": some[:8], "limit": "50"},
                "created in the last minute": {
                    "created_after": newest["executions"][0]["created_at"],
                    "limit": "50",
                },
                "page 100 (cursor)": {"cursor": some[:-4] + "0000", "limit": "50"},
            }
            for name, params in cases.items():
                median, p90 = timed(url, params, args.requests)
                print(f"{name:28} median {median:6.1f} ms   p90 {p90:6.1f} ms")
        finally:
            kernel.stop()


if __name__ == "__main__":
    main()
