"""A replica cut off from PostgreSQL: three `rebuno server` replicas on one database, the third
reaching it through a proxy that the scenario cuts and heals, both ways a network fails: by
refusing (every connection reset, new ones refused) and by blackholing (connections stay open,
nothing gets through).

The replicas' singleton work (the sweep and the deadline check, every 50 ms here) runs under a
session advisory lock (`REBUNO_LEADER_LOCK_KEY`): the replica whose session holds it is the
leader. A thread reads `pg_locks` every few milliseconds; at no instant may two sessions hold
one key. A blackhole cut starts while the cut replica leads, when the sampler catches it doing
so, which is the worst moment: its session keeps the lock with nothing getting through.

Requests to the cut replica must be answered within a bound, never left hanging: a 5xx error
envelope, or a 200 when the cut healed while the request waited (a replica rides through a
short outage by design). The other replicas must keep answering, and after each heal the figure
is how long the cut replica takes to answer a read again.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

import httpx

from bench.processes import AGENT_ID, fresh_store
from chaos.cluster import TOKEN, Cut, Proxy, connect, percentile, write_manifest
from chaos.result import Result, Scale
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, Server
from rebuno.kernel.store.postgres.connection import lock_key

NAME = "partition"
SUMMARY = "a replica cut off from PostgreSQL: one leader at most, bounded answers, recovery"

LEADER_KEY = "rebuno_scheduler_leader"
KEYS = {LEADER_KEY: "sweep", f"{LEADER_KEY}:deadlines": "deadlines"}
ENV = {
    **FAST_RECOVERY,
    "REBUNO_CLEANUP_INTERVAL": "50ms",
    "REBUNO_DEADLINE_CHECK_INTERVAL": "50ms",
    "REBUNO_LEADER_LOCK_KEY": LEADER_KEY,
}
CUT_REPLICA = "replica-3"


@dataclass(frozen=True, slots=True)
class Plan:
    cuts: tuple[Cut, ...]
    cut_seconds: tuple[float, float]
    settle_seconds: float


PLANS = {
    Scale.CI: Plan(cuts=(Cut.REFUSE, Cut.BLACKHOLE), cut_seconds=(1.5, 7.5), settle_seconds=0.5),
    Scale.FULL: Plan(cuts=(Cut.REFUSE, Cut.BLACKHOLE) * 3, cut_seconds=(5, 15), settle_seconds=2),
}
"""At CI scale the refusal lasts 1.5 s and the blackhole 7.5 s, past the lock session's idle limit;
at full scale every cut lasts 5 to 15 s, drawn at random."""
ACQUIRE_SECONDS = 10.0
USE_SECONDS = 10.0
CANCEL_SECONDS = 10.0
ANSWER_BOUND_SECONDS = max(ACQUIRE_SECONDS, USE_SECONDS + CANCEL_SECONDS) + 1.0
"""The longest a request to the cut replica may wait for its answer (docs/deployment.md): it
gets a pooled connection within 10 s or a 5xx; a statement sent into the blackhole is given up
after 10 s, and psycopg's cancellation of it takes up to 10 s more when nothing gets through.
Then a second of slack."""
LEAD_RELEASE_SECONDS = 8.0
"""The longest a cut-off replica's session may keep a leader lock: idle for 6 s, the server
ends it (the replica stopped its job after an unanswered keepalive, within 3 s)."""
RECOVERY_SECONDS = 15.0
PROBE_EVERY = 0.1
PROBE_TIMEOUT = 60.0
SAMPLE_EVERY = 0.005
LEAD_WAIT_SECONDS = 10.0


def _lock_ids(name: str) -> tuple[int, int]:
    """`(classid, objid)` of a bigint advisory lock's `pg_locks` row."""
    key = lock_key(name) & 0xFFFF_FFFF_FFFF_FFFF
    return key >> 32, key & 0xFFFF_FFFF


_HOLDERS = """
    SELECT l.classid::bigint, l.objid::bigint, a.application_name
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
"""Advisory locks are per database, and `pg_locks` shows the whole server's."""


@dataclass
class Leaders:
    """Who holds each leader key, read from `pg_locks` on a thread."""

    url: str
    most: int = 0
    samples: int = 0
    changes: int = 0
    held_by: dict[str, str] = field(default_factory=dict)
    """Key name -> the application name of its holder at the last sample ('' for none)."""
    cut_holding: dict[str, float] = field(default_factory=dict)
    """Key name -> since when (monotonic) the cut replica has held it without a break."""
    longest_cut_hold: float = 0.0
    cut: bool = False
    """Whether the cut replica is cut off now: only then does its holding a key count."""

    def __post_init__(self) -> None:
        self._names = {_lock_ids(name): name for name in KEYS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def leading(self, application: str) -> bool:
        return application in self.held_by.values()

    def _sample(self) -> None:
        with connect(self.url) as conn:
            while not self._stop.wait(SAMPLE_EVERY):
                rows = conn.execute(_HOLDERS).fetchall()
                self._note(rows, time.monotonic())

    def _note(self, rows: list[tuple[object, ...]], now: float) -> None:
        holders: dict[str, list[str]] = {name: [] for name in KEYS}
        for classid, objid, application in rows:
            name = self._names.get((int(str(classid)), int(str(objid))))
            if name is not None:
                holders[name].append(str(application))
        self.samples += 1
        for name, found in holders.items():
            self.most = max(self.most, len(found))
            holder = found[0] if found else ""
            self.changes += holder != self.held_by.get(name, "")
            self.held_by[name] = holder
            if holder == CUT_REPLICA and self.cut:
                since = self.cut_holding.setdefault(name, now)
                self.longest_cut_hold = max(self.longest_cut_hold, now - since)
            else:
                self.cut_holding.pop(name, None)


@dataclass(frozen=True, slots=True)
class Probe:
    began: float
    seconds: float
    status: int
    """The HTTP status, 0 for no answer within the probe's timeout or a refused connection."""
    envelope: bool
    """The answer is a JSON error envelope (`code` and `message`)."""
    error: str = ""
    """What the client saw instead of an answer (the httpx exception's class)."""


class Prober:
    """Sends `GET /v0/executions/<id>` to one replica every `PROBE_EVERY` seconds, each on a
    thread of its own, so a request that hangs does not hold up the next."""

    def __init__(self, url: str, execution_id: str) -> None:
        self.probes: list[Future[Probe]] = []
        self._url = f"{url}/v0/executions/{execution_id}"
        self._pool = ThreadPoolExecutor(64)
        self._http = httpx.Client(
            timeout=PROBE_TIMEOUT,
            headers={"Authorization": f"Bearer {TOKEN}"},
            # A new connection per probe: a kept-alive one the server closes as the next
            # request goes out would fail on the client's side, not the kernel's.
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=0),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> list[Probe]:
        self._stop.set()
        self._thread.join(10)
        done = [probe.result() for probe in self.probes]
        self._pool.shutdown()
        self._http.close()
        return done

    def _run(self) -> None:
        while not self._stop.wait(PROBE_EVERY):
            self.probes.append(self._pool.submit(self._probe))

    def _probe(self) -> Probe:
        began = time.monotonic()
        try:
            response = self._http.get(self._url)
        except httpx.HTTPError as exc:
            return Probe(began, time.monotonic() - began, 0, False, type(exc).__name__)
        try:
            body = response.json()
            envelope = isinstance(body, dict) and {"code", "message"} <= body.keys()
        except ValueError:
            envelope = False
        return Probe(began, time.monotonic() - began, response.status_code, envelope)


@dataclass(frozen=True, slots=True)
class Window:
    how: Cut
    cut_at: float
    healed_at: float
    recovered_at: float
    led_at_cut: bool


def run(scale: Scale, workdir: Path) -> Result:
    plan = PLANS[scale]
    result = Result(NAME)
    seed = random.randrange(1 << 30)
    result.figures["seed"] = seed
    rng = random.Random(seed)
    with fresh_store("postgres", workdir) as store, Replicas(store.url, workdir) as replicas:
        first = replicas.servers[0]
        execution_id = first.post("/v0/executions", {"agent_id": AGENT_ID, "input": None})["id"]
        leaders = Leaders(store.url)
        probers = [Prober(server.url, execution_id) for server in replicas.servers]
        windows: list[Window] = []
        try:
            for how in plan.cuts:
                time.sleep(plan.settle_seconds)
                seconds = _length(scale, plan, how, rng)
                windows.append(_cut(replicas, how, seconds, leaders))
            time.sleep(plan.settle_seconds)
        finally:
            probes = [prober.stop() for prober in probers]
            leaders.stop()
    _report(result, windows, probes, leaders)
    return result


class Replicas:
    """Three replicas, the last behind a proxy to PostgreSQL; each names itself to the server
    (`application_name`), which is how `pg_locks` tells them apart."""

    def __init__(self, url: str, workdir: Path) -> None:
        self._url = urlsplit(url)
        self._workdir = workdir
        self.proxy = Proxy([(self._url.hostname or "127.0.0.1", self._url.port or 5432)])
        self.servers: list[Server] = []

    def __enter__(self) -> Replicas:
        manifest = write_manifest(self._workdir, free_port())
        user = f"{self._url.username}@" if self._url.username else ""
        proxied = self._url._replace(netloc=f"{user}127.0.0.1:{self.proxy.port}")

        def start(number: int, db_url: SplitResult) -> Server:
            named = db_url._replace(query=f"application_name=replica-{number}").geturl()
            log = self._workdir / f"replica-{number}.log"
            return Server(named, TOKEN, log, manifest=manifest, env=ENV)

        # Side by side: a replica takes seconds to boot on a busy machine.
        with ThreadPoolExecutor(3) as pool:
            started = [pool.submit(start, n, u) for n, u in enumerate(self._urls(proxied), 1)]
        self.servers = [future.result() for future in started if not future.exception()]
        if len(self.servers) < len(started):
            self.__exit__()
            raise next(error for future in started if (error := future.exception()))
        return self

    def _urls(self, proxied: SplitResult) -> tuple[SplitResult, ...]:
        return (self._url, self._url, proxied)

    def __exit__(self, *exc: object) -> None:
        self.proxy.heal()
        for server in self.servers:
            server.stop()
        self.proxy.close()


def _length(scale: Scale, plan: Plan, how: Cut, rng: random.Random) -> float:
    if scale is Scale.CI:
        low, high = plan.cut_seconds
        return low if how is Cut.REFUSE else high
    return rng.uniform(*plan.cut_seconds)


def _cut(replicas: Replicas, how: Cut, seconds: float, leaders: Leaders) -> Window:
    proxy, led = replicas.proxy, False
    if how is Cut.BLACKHOLE:
        deadline = time.monotonic() + LEAD_WAIT_SECONDS
        while not (led := leaders.leading(CUT_REPLICA)) and time.monotonic() < deadline:
            time.sleep(0.001)
    proxy.cut(how)
    cut_at = time.monotonic()
    leaders.cut = True
    time.sleep(seconds)
    leaders.cut = False
    proxy.heal()
    healed_at = time.monotonic()
    recovered_at = _recovered(replicas.servers[-1], healed_at + RECOVERY_SECONDS)
    return Window(how, cut_at, healed_at, recovered_at, led)


def _recovered(server: Server, deadline: float) -> float:
    """When `server` first answers a read of the database with 200."""
    url = f"{server.url}/v0/executions?limit=1"
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, headers=server.headers, timeout=5).status_code == 200:
                return time.monotonic()
        time.sleep(0.02)
    return float("inf")


def _during(probes: list[Probe], windows: list[Window], how: Cut | None = None) -> Iterator[Probe]:
    """Probes sent while a cut (of kind `how`, or any) was in force."""
    for probe in probes:
        if any(w.cut_at <= probe.began < w.healed_at and how in (None, w.how) for w in windows):
            yield probe


def _report(
    result: Result, windows: list[Window], probes: list[list[Probe]], leaders: Leaders
) -> None:
    figures = result.figures
    figures["cuts"] = len(windows)
    figures["leader_samples"] = leaders.samples
    figures["leaders_max"] = leaders.most
    figures["leader_changes"] = leaders.changes
    figures["blackhole_cut_while_leading"] = sum(w.led_at_cut for w in windows)
    figures["cut_replica_longest_lead_s"] = round(leaders.longest_cut_hold, 3)
    result.expect(leaders.most <= 1, f"{leaders.most} sessions held one leader lock at once")
    result.expect(
        leaders.longest_cut_hold <= LEAD_RELEASE_SECONDS,
        f"the cut replica kept a leader lock for {leaders.longest_cut_hold:.1f} s",
    )
    *healthy, cut = probes
    for how in (Cut.REFUSE, Cut.BLACKHOLE):
        during = list(_during(cut, windows, how))
        seconds = [p.seconds for p in during]
        answered = [p for p in during if p.status >= 500 and p.envelope]
        ok = [p for p in during if p.status == 200]
        tag = how.value
        figures[f"{tag}_probes"] = len(during)
        figures[f"{tag}_error_envelopes"] = len(answered)
        figures[f"{tag}_answered_200"] = len(ok)
        figures[f"{tag}_answer_p50_s"] = round(percentile(seconds, 0.5), 3)
        figures[f"{tag}_answer_max_s"] = round(max(seconds, default=0.0), 3)
        recoveries = [w.recovered_at - w.healed_at for w in windows if w.how is how]
        figures[f"{tag}_recovery_max_s"] = round(max(recoveries, default=0.0), 3)
        slow = [p for p in during if p.seconds > ANSWER_BOUND_SECONDS]
        result.expect(
            not slow,
            f"{len(slow)} of {len(during)} request(s) to the {tag} replica took over "
            f"{ANSWER_BOUND_SECONDS:g} s (longest {max(seconds, default=0):.1f} s)",
        )
        unclear = [p for p in during if p.status != 200 and not (p.status >= 500 and p.envelope)]
        kinds = Counter(f"{p.status or p.error}" for p in unclear)
        result.expect(
            not unclear, f"{len(unclear)} {tag} request(s) got no error envelope: {dict(kinds)}"
        )
        result.expect(
            all(r <= RECOVERY_SECONDS for r in recoveries), f"the {tag} replica did not recover"
        )
    others = [p for prober in healthy for p in _during(prober, windows)]
    failed = [p for p in others if p.status != 200]
    figures["healthy_replica_probes"] = len(others)
    figures["healthy_replica_failures"] = len(failed)
    figures["healthy_replica_p99_s"] = round(percentile([p.seconds for p in others], 0.99), 3)
    result.expect(not failed, f"{len(failed)} request(s) to a connected replica failed")
