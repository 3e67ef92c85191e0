"""PostgreSQL restarted at random intervals under load: a private cluster (its own `initdb`,
its own port), two replicas on it, the thinking agent behind a balancer over both, clients
creating executions until enough were accepted. Each restart stops the server (fast mode, so
every session is cut), leaves it down a moment and starts it again.

Every execution in the database must complete, and every event log must be exactly
`event_seq` 1..n: no gap, no duplicate. Reported beside them: how long the replicas took to be
ready again after each start, and how many creations were refused while the server was down.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from chaos.cluster import Creator, Fleet, fleet, percentile, private_cluster, wait_drained
from chaos.result import Result, Scale
from harness.processes import Server

NAME = "postgres_restart"
SUMMARY = "PostgreSQL restarted at random under 2 replicas: all complete, event_seq contiguous"

REPLICAS = 2
STEPS = 3
PAUSE = 0.05
DATABASE = "rebuno_chaos"


@dataclass(frozen=True, slots=True)
class Plan:
    executions: int
    rate: float
    restart_every: tuple[float, float]
    down: tuple[float, float]


PLANS = {
    Scale.CI: Plan(executions=50, rate=12, restart_every=(1.5, 2.0), down=(0.2, 0.4)),
    Scale.FULL: Plan(executions=1000, rate=12, restart_every=(6, 14), down=(0.1, 2.0)),
}
DRAIN_SECONDS = 120
READY_SECONDS = 30


def run(scale: Scale, workdir: Path) -> Result:
    plan = PLANS[scale]
    result = Result(NAME)
    seed = random.randrange(1 << 30)
    result.figures["seed"] = seed
    rng = random.Random(seed)
    with private_cluster() as cluster:
        cluster.create_database(DATABASE)
        url = cluster.url(DATABASE)
        with fleet([url] * REPLICAS, workdir, {"REBUNO_DISPATCH_MAX_ATTEMPTS": "100"}) as f:
            creator = Creator(
                lambda: [s.url for s in f.live()],
                plan.rate,
                {"steps": STEPS, "pause": PAUSE},
                limit=plan.executions,
            )
            ready: list[float] = []
            try:
                while not creator.done.wait(rng.uniform(*plan.restart_every)) or not ready:
                    cluster.stop()
                    time.sleep(rng.uniform(*plan.down))
                    cluster.start()
                    ready.append(_ready_after(f))
            finally:
                creator.stop()
            drained = wait_drained(url, DRAIN_SECONDS)
    result.figures.update(
        {
            "replicas": REPLICAS,
            "restarts": len(ready),
            "executions": len(drained.statuses),
            "answered_creates": len(creator.ids),
            "refused_creates": creator.failed,
            "completed": drained.count("completed"),
            "unfinished": len(drained.unfinished),
            "event_seq_gaps": drained.seq_gaps,
            "event_seq_duplicates": drained.seq_duplicates,
            "double_terminal_events": len(drained.double_terminal),
            "ready_after_start_p50_s": round(percentile(ready, 0.5), 3),
            "ready_after_start_max_s": round(max(ready, default=0.0), 3),
        }
    )
    total = len(drained.statuses)
    result.expect(len(creator.ids) >= plan.executions, "fewer executions created than planned")
    result.expect(
        drained.count("completed") == total,
        f"{total - drained.count('completed')} of {total} execution(s) did not complete, "
        f"e.g. {drained.unfinished[:3]}",
    )
    result.expect(drained.seq_gaps == 0, f"{drained.seq_gaps} event log(s) with a gap")
    result.expect(drained.seq_duplicates == 0, f"{drained.seq_duplicates} with a duplicate seq")
    result.expect(not drained.double_terminal, "an execution ended twice")
    return result


def _ready_after(f: Fleet) -> float:
    """Seconds from now until every replica answers `/v0/ready` with 200."""
    started = time.monotonic()
    waiting = list(f.live())
    while waiting and time.monotonic() - started < READY_SECONDS:
        waiting = [server for server in waiting if not _ready(server)]
        if waiting:
            time.sleep(0.02)
    return time.monotonic() - started


def _ready(server: Server) -> bool:
    try:
        return server.ready() == 200
    except httpx.HTTPError:
        return False
