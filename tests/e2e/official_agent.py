"""An agent written against the official Rebuno Python SDK, run unchanged against our kernel.

Two tools; each appends its name to a side file when its body runs, so the test can count
real executions. With CRASH_IN_SECOND set, the first run of `second` kills its own process
with SIGKILL halfway through, after `first` was recorded: the kernel must re-dispatch and the
handler must replay `first` and run `second` to completion. With WAIT_IN_SECOND set, `second`
waits until the process gets SIGUSR1 (once, for every run after it too), which lets a test
crash the kernel while the step runs.
"""

import asyncio
import functools
import os
import signal
import sys
from typing import Any

from rebuno import Agent, tool

SIDE = os.environ["SIDE_FILE"]


def note(name: str) -> None:
    with open(SIDE, "a") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@functools.cache
def gate() -> asyncio.Event:
    """Set by SIGUSR1, and open from then on. Made inside the agent's loop before `second`
    notes that it runs, so the test's signal never meets the default action (which ends the
    process)."""
    opened = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, opened.set)
    return opened


@tool
async def first(topic: str) -> dict[str, Any]:
    note("first")
    return {"topic": topic, "found": [1, 2.5]}


@tool("second")
async def second(found: list[Any]) -> str:
    opened = gate() if os.environ.get("WAIT_IN_SECOND") else None
    note("second")
    if opened is not None:
        await opened.wait()
    crash_marker = os.environ.get("CRASH_IN_SECOND")
    if crash_marker and not os.path.exists(crash_marker):
        open(crash_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return f"{len(found)} results"


async def process(topic: str) -> dict[str, Any]:
    hits = await first(topic)
    summary = await second(hits["found"])
    return {"summary": summary, "topic": hits["topic"]}


if __name__ == "__main__":
    agent = Agent("compat", secret="compat-secret", base_url=sys.argv[1])
    agent.run(process, host="127.0.0.1", port=int(sys.argv[2]))
