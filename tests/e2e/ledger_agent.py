"""An agent process built with this SDK, served by `Agent.run()`, whose handler runs `steps`
sequential plain `step()` calls; each body notes in a ledger that it really ran.

Configured by the environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `PORT`,
`DURABILITY` (the `Agent`'s; when it is unset the agent is built with the defaults), `LEDGER`
(each step body appends `<step index> <pid>` there and fsyncs before it returns) and
`CRASH_AT` (the step whose body, once its line is in the ledger, kills this process with
SIGKILL: the previous step's body has returned, the crashing step's has not).

Imports the public SDK (and the type naming its durabilities) and the standard library.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from rebuno import Agent, step
from rebuno.sdk.agent import Durability

LEDGER = Path(os.environ["LEDGER"])
CRASH_AT = int(os.environ.get("CRASH_AT") or 0)
DURABILITIES: dict[str, Durability] = {"durable": "durable", "batched": "batched"}


def note(i: int) -> dict[str, int]:
    """Step `i`'s body. It is synchronous on purpose: a run of such steps never gives the
    event loop a turn, so under `durability="batched"` nothing is reported before the crash,
    and the cost of that mode shows in full."""
    pid = os.getpid()
    with LEDGER.open("a") as ledger:
        ledger.write(f"{i} {pid}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    if i == CRASH_AT:
        os.kill(pid, signal.SIGKILL)
    return {"i": i, "pid": pid}


async def count(steps: int) -> dict[str, Any]:
    """Runs steps 1 to `steps`; the output is what each returned, recorded or replayed."""
    return {"steps": [await step("note", note, args={"i": i}) for i in range(1, steps + 1)]}


def agent() -> Agent:
    """The agent as a user builds it: with no `durability` unless `DURABILITY` names one."""
    chosen = os.environ.get("DURABILITY")
    if chosen is None:
        return Agent(os.environ["AGENT_ID"])
    return Agent(os.environ["AGENT_ID"], durability=DURABILITIES[chosen])


if __name__ == "__main__":
    agent().run(count, host="127.0.0.1", port=int(os.environ["PORT"]))
