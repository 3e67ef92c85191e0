"""Replicas SIGKILLed at random under steady load: three `rebuno server` processes on one
PostgreSQL database, the thinking agent behind a balancer over all three, clients creating
executions on the replicas in turn. Every few seconds one replica is killed and started again.

Every execution created must end exactly once: none left unfinished after the load (lost),
none with two terminal events. The figure of interest is the reclaim latency: from a kill to
the redelivery of each dispatch it left behind (a delivery cut short, or a run the agent gave
up because its call reached the dead replica), which the lease (1 s) and the reaper bound.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.processes import fresh_store
from chaos.cluster import Creator, Fleet, connect, fleet, percentile, replica_id, wait_drained
from chaos.result import Result, Scale

NAME = "replica_kill"
SUMMARY = "3 replicas on PostgreSQL, one SIGKILLed at random under load: nothing lost or doubled"

REPLICAS = 3
STEPS = 4
PAUSE = 0.25
"""Seconds each step thinks: an execution is in flight for a second or more."""


@dataclass(frozen=True, slots=True)
class Plan:
    seconds: float
    rate: float
    """Executions created per second."""
    kill_every: tuple[float, float]
    """Seconds between kills, drawn uniformly from this range."""
    down: float
    """Seconds a killed replica stays down before it is started again."""


PLANS = {
    Scale.CI: Plan(seconds=8, rate=6, kill_every=(2.5, 3.5), down=0.5),
    Scale.FULL: Plan(seconds=120, rate=8, kill_every=(3, 6), down=1),
}
DRAIN_SECONDS = 90
SAMPLE_SECONDS = 0.05


@dataclass
class Reclaims:
    """Watches, on a thread, every dispatch in flight when a replica died, until it is
    delivered again (a higher attempt: reclaimed) or leaves `in_flight` (finished where it
    was)."""

    url: str
    pending: dict[str, tuple[int, float, bool]] = field(default_factory=dict)
    """dispatch id -> (attempt at the kill, the kill's monotonic time, held by the victim)."""
    latencies: list[float] = field(default_factory=list)
    victims: list[float] = field(default_factory=list)
    """The latencies of the dispatches the killed replica itself had claimed."""
    finished_in_place: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def killed(self, victim: str, at: float) -> int:
        """Notes the dispatches in flight at a kill (`victim` the replica id); how many."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT id, attempt, locked_by FROM dispatches WHERE status = 'in_flight'"
            ).fetchall()
        with self._lock:
            for dispatch_id, attempt, locked_by in rows:
                assert isinstance(dispatch_id, str) and isinstance(attempt, int)
                # A dispatch already watched keeps its earlier kill: the longer wait.
                self.pending.setdefault(dispatch_id, (attempt, at, locked_by == victim))
        return len(rows)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            with self._lock:
                watched = list(self.pending)
            if not watched:
                continue
            with connect(self.url) as conn:
                rows = conn.execute(
                    "SELECT id, attempt, status FROM dispatches WHERE id = ANY(%s)", (watched,)
                ).fetchall()
            seen = time.monotonic()
            with self._lock:
                for dispatch_id, attempt, status in rows:
                    assert isinstance(dispatch_id, str) and isinstance(attempt, int)
                    before, at, held = self.pending[dispatch_id]
                    if attempt > before:
                        self.latencies.append(seen - at)
                        if held:
                            self.victims.append(seen - at)
                    elif status != "in_flight":
                        self.finished_in_place += 1
                    else:
                        continue
                    del self.pending[dispatch_id]


def run(scale: Scale, workdir: Path) -> Result:
    plan = PLANS[scale]
    result = Result(NAME)
    seed = random.randrange(1 << 30)
    result.figures["seed"] = seed
    with fresh_store("postgres", workdir) as store, fleet([store.url] * REPLICAS, workdir, {}) as f:
        _load(f, plan, random.Random(seed), store.url, result)
    return result


def _load(f: Fleet, plan: Plan, rng: random.Random, url: str, result: Result) -> None:
    reclaims = Reclaims(url)
    creator = Creator(
        lambda: [server.url for server in f.live()], plan.rate, {"steps": STEPS, "pause": PAUSE}
    )
    began = time.monotonic()
    kills, in_flight_at_kills = 0, 0
    try:
        while time.monotonic() - began + plan.kill_every[0] < plan.seconds:
            time.sleep(rng.uniform(*plan.kill_every))
            index = rng.randrange(REPLICAS)
            victim = replica_id(f.kill(index))
            kills += 1
            in_flight_at_kills += reclaims.killed(victim, time.monotonic())
            time.sleep(plan.down)
            f.restart(index)
        time.sleep(max(0.0, plan.seconds - (time.monotonic() - began)))
    finally:
        creator.stop()
    drained = wait_drained(url, DRAIN_SECONDS)
    reclaims.stop()
    created = set(creator.ids)
    missing = created - set(drained.statuses)
    lost = len(drained.unfinished) + len(missing)
    doubled = drained.double_terminal
    result.figures.update(
        {
            "replicas": REPLICAS,
            "kills": kills,
            "executions": len(drained.statuses),
            "answered_creates": len(created),
            "failed_creates": creator.failed,
            "completed": drained.count("completed"),
            "lost_executions": lost,
            "double_terminal_events": len(doubled),
            "in_flight_at_kills": in_flight_at_kills,
            "reclaimed": len(reclaims.latencies),
            "finished_in_place": reclaims.finished_in_place,
            "reclaim_p50_s": round(percentile(reclaims.latencies, 0.5), 3),
            "reclaim_p99_s": round(percentile(reclaims.latencies, 0.99), 3),
            "reclaim_max_s": round(max(reclaims.latencies, default=0.0), 3),
            "victim_reclaimed": len(reclaims.victims),
            "victim_reclaim_p99_s": round(percentile(reclaims.victims, 0.99), 3),
        }
    )
    result.expect(kills > 0, "no replica was killed")
    examples = sorted(missing)[:3] + drained.unfinished[:3]
    result.expect(lost == 0, f"{lost} execution(s) lost, e.g. {examples}")
    result.expect(not doubled, f"{len(doubled)} execution(s) ended twice, e.g. {doubled[:3]}")
    result.expect(
        drained.count("completed") == len(drained.statuses),
        f"{len(drained.statuses) - drained.count('completed')} execution(s) did not complete",
    )
    result.expect(
        not reclaims.pending, f"{len(reclaims.pending)} dispatch(es) never reclaimed nor finished"
    )
