"""Clocks that disagree: an agent whose clock is off signs with a shifted `Rebuno-Timestamp`,
and a replica whose clock is off is a kernel served in this process on a shifted clock. The
request scheme (docs/protocol.md §2.3) accepts a timestamp within 300 s of the kernel's clock,
bounds included, so of each pair of skews (±30 s, ±6 min, or none, on either side) the
signatures whose offsets differ by at most 300 s verify and the others are refused with 401.

Each replica gets one delivery (a loopback receiver takes the webhook and keeps its lease);
then an agent at each skew signs a read, a heartbeat and a step submission under that lease,
and so do agents 295 s and 305 s off the replica's own clock, either way, just inside and just
outside the window.
On the replicas off by 30 s (at CI scale, the one ahead) a real program agent, whose clock is
right, also runs executions to their end.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from chaos.result import Result, Scale
from chaos.rig import AGENT_ID, SECRET, InProcessKernel, Programs, fast_settings
from harness.ports import free_port
from harness.webhooks import Delivery, WebhookReceiver
from rebuno.kernel.service.context import utc_now
from rebuno.protocol import signing
from rebuno.protocol.signing import TIMESTAMP_WINDOW_SECONDS

NAME = "clock_skew"
SUMMARY = "agent and replica clocks off by ±30 s and ±6 min: signatures outside the window refused"
SKEWS = (0, 30, -30, 360, -360)
"""Seconds an agent's or a replica's clock is ahead of the true time."""
EDGES = (295, -295, 305, -305)
"""Offsets from the replica's own clock just inside and just outside the window."""
REPEATS = {Scale.CI: 1, Scale.FULL: 4}
RUNS = {Scale.CI: 2, Scale.FULL: 10}
PROGRAM_REPLICAS = {Scale.CI: (30,), Scale.FULL: (30, -30)}
"""The replicas a program agent runs `RUNS` executions on."""
PROGRAM = {"ops": [{"t": "tool", "name": "a", "once": False, "arg": 1}, {"t": "local", "arg": 2}]}


class SkewedAgent:
    """Signed agent calls (the `v1=` scheme) stamped with a clock `skew` seconds off."""

    def __init__(self, base_url: str) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=10)

    def close(self) -> None:
        self._http.close()

    def call(
        self, method: str, path: str, skew: int, body: object = None, lease: Delivery | None = None
    ) -> int:
        content = b"" if body is None else json.dumps(body).encode()
        timestamp = str(int(time.time() + skew))
        dispatch_id, attempt = (lease.dispatch_id, str(lease.attempt)) if lease else ("", "")
        signature = signing.sign_request(
            SECRET, method, path, timestamp, dispatch_id, attempt, content
        )
        headers = {
            "Content-Type": "application/json",
            signing.AGENT_ID_HEADER: AGENT_ID,
            signing.TIMESTAMP_HEADER: timestamp,
            signing.SIGNATURE_HEADER: signature,
            **(lease.headers() if lease else {}),
        }
        return self._http.request(method, path, content=content, headers=headers).status_code

    def calls(self, lease: Delivery, skew: int, nonce: int) -> list[int]:
        """A read, a heartbeat and a step submission; their status codes."""
        execution = f"/v0/executions/{lease.execution_id}"
        step = {"kind": "tool_call", "target": "probe", "args": {"skew": skew, "n": nonce}}
        return [
            self.call("GET", execution, skew),
            self.call("POST", f"{execution}/heartbeat", skew, lease=lease),
            self.call("POST", f"{execution}/steps", skew, step, lease),
        ]


def shifted(skew: int) -> Any:
    offset = timedelta(seconds=skew)

    def now() -> datetime:
        return utc_now() + offset

    return now


@dataclasses.dataclass
class Tally:
    accepted: Counter[tuple[int, int]] = dataclasses.field(default_factory=Counter)
    refused: Counter[tuple[int, int]] = dataclasses.field(default_factory=Counter)
    wrong: list[str] = dataclasses.field(default_factory=list)
    runs: Counter[str] = dataclasses.field(default_factory=Counter)
    edges: Counter[tuple[int, bool]] = dataclasses.field(default_factory=Counter)
    """Calls at each edge offset, by whether they were accepted."""


def run(scale: Scale, workdir: Path) -> Result:
    tally = Tally()
    for replica in SKEWS:
        folder = workdir / f"replica{replica:+d}"
        folder.mkdir()
        probe(scale, folder, replica, tally)
        if replica in PROGRAM_REPLICAS[scale]:
            programs(scale, folder / "agent", replica, tally)
    return judge(tally)


def probe(scale: Scale, workdir: Path, replica: int, tally: Tally) -> None:
    """One replica at `replica` seconds off, probed by agents at every skew."""
    receiver = WebhookReceiver(SECRET)
    settings = fast_settings(workdir, receiver.url)
    # The probes hold their lease for the whole round; no agent renews it meanwhile.
    settings = dataclasses.replace(settings, dispatch_lease_timeout=timedelta(minutes=5))
    kernel = InProcessKernel(settings, clock=shifted(replica))
    agent = SkewedAgent(kernel.url)
    try:
        created = httpx.post(f"{kernel.url}/v0/executions", json={"agent_id": AGENT_ID})
        created.raise_for_status()
        (lease,) = receiver.wait_for(bool, 10, "the webhook")
        for n in range(REPEATS[scale]):
            for skew in SKEWS:
                for status in agent.calls(lease, skew, n):
                    classify(tally, replica, skew, status)
            for edge in EDGES:
                for status in agent.calls(lease, replica + edge, n):
                    tally.edges[(edge, status < 300)] += 1
    finally:
        agent.close()
        kernel.stop()
        receiver.close()


def classify(tally: Tally, replica: int, skew: int, status: int) -> None:
    inside = abs(skew - replica) <= TIMESTAMP_WINDOW_SECONDS
    if status == 401:
        tally.refused[(replica, skew)] += 1
    elif status < 300:
        tally.accepted[(replica, skew)] += 1
    else:
        tally.wrong.append(f"replica {replica:+d} s, agent {skew:+d} s: status {status}")
        return
    if inside != (status < 300):
        verdict = "refused" if inside else "accepted"
        tally.wrong.append(f"replica {replica:+d} s, agent {skew:+d} s: {verdict}")


def programs(scale: Scale, workdir: Path, replica: int, tally: Tally) -> None:
    """A program agent with a true clock runs executions on a replica `replica` s off."""
    workdir.mkdir()
    port = free_port()
    kernel = InProcessKernel(
        fast_settings(workdir, f"http://127.0.0.1:{port}/webhook"), clock=shifted(replica)
    )
    rig = Programs(workdir, kernel.url, port)
    try:
        rig.start_agent()
        ids = [rig.create(PROGRAM) for _ in range(RUNS[scale])]
        left = rig.wait_finished(ids, 60)
        tally.runs.update(rig.execution(i)["status"] for i in ids)
        tally.runs["unfinished"] += len(left)
    finally:
        rig.close()
        kernel.stop()


def judge(tally: Tally) -> Result:
    result = Result(NAME)
    for replica in SKEWS:
        for skew in SKEWS:
            pair = (replica, skew)
            result.figures[f"replica{replica:+d}_agent{skew:+d}"] = (
                f"{tally.accepted[pair]} accepted, {tally.refused[pair]} refused"
            )
    result.figures["accepted"] = sum(tally.accepted.values())
    result.figures["refused"] = sum(tally.refused.values())
    result.figures["wrong"] = len(tally.wrong)
    inside = [edge for edge in EDGES if abs(edge) <= TIMESTAMP_WINDOW_SECONDS]
    outside = [edge for edge in EDGES if edge not in inside]
    wrong_inside = sum(tally.edges[(edge, False)] for edge in inside)
    wrong_outside = sum(tally.edges[(edge, True)] for edge in outside)
    result.figures["edge_295s_accepted"] = sum(tally.edges[(edge, True)] for edge in inside)
    result.figures["edge_295s_refused"] = wrong_inside
    result.figures["edge_305s_accepted"] = wrong_outside
    result.figures["edge_305s_refused"] = sum(tally.edges[(edge, False)] for edge in outside)
    result.expect(wrong_inside == 0, f"{wrong_inside} signature(s) 295 s off refused")
    result.expect(wrong_outside == 0, f"{wrong_outside} signature(s) 305 s off accepted")
    result.figures["sdk_runs_completed"] = tally.runs["completed"]
    result.figures["sdk_runs_other"] = sum(tally.runs.values()) - tally.runs["completed"]
    for wrong in tally.wrong[:10]:
        result.failures.append(wrong)
    result.expect(
        result.figures["sdk_runs_other"] == 0,
        f"executions on a replica 30 s off did not all complete: {dict(tally.runs)}",
    )
    return result
