"""The agent the scenarios drive: an agent built with this SDK, served by `Agent.run()`, whose
handler runs the *program* in the execution's input and notes every step body in a ledger.

A program is `{"ops": [...], "crash": [...]}`. Each op is one effect, run in order:

* `{"t": "tool", "name": N, "once": bool, "arg": A}`: a tool call (`at_most_once` when `once`),
  whose arguments are `{"name": N, "arg": A}`, so two ops with the same name and argument are
  repeated identical calls;
* `{"t": "local", "arg": A}`: a `step()`;
* `{"t": "llm"}`: a chat completion through `http_client()` to the stub model at
  `PROVIDER_URL`, whose prompt names the execution and the op.

A crash point `{"op": i, "at": W}` kills this process with SIGKILL at op `i`: `before` its call
is made, in its `body` once the effect is in the ledger, `after` its call returned (its outcome
not yet reported) or during the `report` (a few milliseconds after it returned, while the
handler goes on and the outcome travels). A point fires once (a marker file under `MARKS`
remembers it) and only in a process started with `ARMED=1`.

Each ledger line is a JSON object written with one `write` on an append-only descriptor, so
it survives the SIGKILL: `handler` (a run of the handler began), `start` and `effect` (a body
began, its effect happened; with the body run's `run` id) and `crash` (a crash point fired).
The handler returns `{"results": [...]}`, one per op: the body run's `{"op", "run"}`, the stub's
`{"op", "reply"}`, `{"op", "error"}` for a call that raised `ToolError` or `{"op", "denied"}`
for one the kernel refused.

Configured by the environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `PORT`,
`LEDGER`, `MARKS`, `ARMED`, `PROVIDER_URL`, `JITTER_MS` (each body sleeps up to that long).
With `ZYGOTE=1` the process serves nothing itself and forks agent processes on request
(`zygote`).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import random
import select
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from rebuno import Agent, ToolError, execution, http_client, step, tool

LEDGER = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
MARKS = Path(os.environ["MARKS"])
ARMED = os.environ.get("ARMED") == "1"
PROVIDER_URL = os.environ.get("PROVIDER_URL", "")
JITTER = float(os.environ.get("JITTER_MS") or 0) / 1000
REPORT_KILL_MAX = 0.02
"""The longest a `report` crash waits after its call returned, in seconds."""

_MODEL: httpx.AsyncClient | None = None
CURRENT_OP: contextvars.ContextVar[int] = contextvars.ContextVar("chaos_op")
CRASHES: dict[str, set[tuple[int, str]]] = {}
"""The crash points of each execution this process runs."""


def note(phase: str, **fields: Any) -> None:
    line = json.dumps({"ph": phase, "pid": os.getpid(), "t": time.time(), **fields})
    os.write(LEDGER, line.encode() + b"\n")


def crash_here(execution_id: str, op: int, at: str) -> None:
    """SIGKILLs this process if `(op, at)` is one of the execution's crash points not yet
    fired and this process is armed."""
    if not ARMED or (op, at) not in CRASHES.get(execution_id, set()):
        return
    try:
        os.close(os.open(MARKS / f"{execution_id}-{op}-{at}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    if at == "report":
        delay = random.uniform(0, REPORT_KILL_MAX)
        threading.Thread(target=_kill_later, args=(execution_id, op, delay), daemon=True).start()
        return
    note("crash", e=execution_id, op=op, at=at)
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_later(execution_id: str, op: int, delay: float) -> None:
    time.sleep(delay)
    note("crash", e=execution_id, op=op, at="report")
    os.kill(os.getpid(), signal.SIGKILL)


async def effect(kind: str, arg: Any) -> dict[str, Any]:
    """A step body: notes its start, waits a little, notes its effect, maybe crashes."""
    execution_id, op, run = execution().id, CURRENT_OP.get(), uuid.uuid4().hex[:12]
    note("start", e=execution_id, op=op, run=run, kind=kind)
    if JITTER:
        await asyncio.sleep(random.uniform(0, JITTER))
    note("effect", e=execution_id, op=op, run=run, kind=kind)
    crash_here(execution_id, op, "body")
    return {"op": op, "run": run}


@tool("chaos.safe")
async def safe(name: str, arg: Any) -> dict[str, Any]:
    return await effect("safe", arg)


@tool("chaos.once", idempotency="at_most_once")
async def once(name: str, arg: Any) -> dict[str, Any]:
    return await effect("once", arg)


async def run_op(execution_id: str, index: int, op: dict[str, Any]) -> dict[str, Any]:
    CURRENT_OP.set(index)
    try:
        if op["t"] == "tool":
            call = once if op.get("once") else safe
            outcome: Any = await call(name=op["name"], arg=op.get("arg"))
        elif op["t"] == "local":
            outcome = await step("chaos.local", effect, args={"kind": "local", "arg": op["arg"]})
        else:
            outcome = await ask(execution_id, index)
    except ToolError as exc:
        return {"op": index, "error": exc.message}
    # A denied call returns its refusal as text: an `at_most_once` call repeated after an
    # earlier identical one was left indeterminate is refused so.
    return dict(outcome) if isinstance(outcome, dict) else {"op": index, "denied": str(outcome)}


def model() -> httpx.AsyncClient:
    """This process's one client of the stub model: building a client loads TLS settings,
    which holds up the event loop (and the heartbeats on it) for a while each time."""
    global _MODEL
    if _MODEL is None:
        _MODEL = http_client(timeout=10)
    return _MODEL


async def ask(execution_id: str, index: int) -> dict[str, Any]:
    """One chat completion from the stub model; its reply names the call's ordinal there."""
    prompt = f"{execution_id} {index}"
    body = {"model": "chaos-stub", "messages": [{"role": "user", "content": prompt}]}
    response = await model().post(f"{PROVIDER_URL}/chat/completions", json=body)
    response.raise_for_status()
    content: str = response.json()["choices"][0]["message"]["content"]
    return {"op": index, "reply": int(content.split()[1].removeprefix("#"))}


async def program(ops: list[dict[str, Any]], crash: list[dict[str, Any]] | None = None) -> Any:
    execution_id = execution().id
    CRASHES[execution_id] = {(int(point["op"]), str(point["at"])) for point in crash or ()}
    note("handler", e=execution_id)
    results = []
    for index, op in enumerate(ops):
        crash_here(execution_id, index, "before")
        results.append(await run_op(execution_id, index, op))
        crash_here(execution_id, index, "after")
        crash_here(execution_id, index, "report")
    return {"results": results}


def serve() -> None:
    Agent(os.environ["AGENT_ID"]).run(program, host="127.0.0.1", port=int(os.environ["PORT"]))


def zygote() -> None:
    """Starts agent processes on request, each a fork of this one with everything imported,
    so a restart after a kill costs milliseconds rather than an interpreter's start. Reads
    `start <0|1> <log path>` lines on stdin and prints `started <pid>`; prints `exited <pid>`
    once a child has died. Ends at the end of its input, killing the children left."""
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.005)
        if ready:
            line = sys.stdin.readline()
            if not line:
                break
            _, armed, log = line.split(maxsplit=2)
            children.add(fork(armed == "1", log.strip()))
        while children:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            print(f"exited {pid}", flush=True)
    for pid in children:
        os.kill(pid, signal.SIGKILL)


def fork(armed: bool, log: str) -> int:
    pid = os.fork()
    if pid:
        print(f"started {pid}", flush=True)
        return pid
    global ARMED
    ARMED = armed
    random.seed()  # the parent's state would give every child the same delays
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    try:
        serve()
    finally:
        os._exit(0)


if __name__ == "__main__":
    if os.environ.get("ZYGOTE") == "1":
        zygote()
    else:
        serve()
