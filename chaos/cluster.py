"""What the cluster scenarios share: a TCP proxy that can cut and heal, replicas of `rebuno
server` on one PostgreSQL database with the thinking agent behind a balancer, a private
PostgreSQL cluster, and the database-side checks of what the replicas wrote.

The processes are the harness's and the benchmark's own (`harness.processes.Server`,
`bench.processes.Process`, the private cluster of `harness.postgres`); this module only wires
them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from bench.processes import AGENT_ID, SECRET, Process
from harness import postgres
from harness.ports import free_port
from harness.postgres import Cluster, pg_bindir
from harness.processes import FAST_RECOVERY, Server

TOKEN = "chaos-token"
TERMINAL_EVENTS = ("execution.completed", "execution.failed", "execution.cancelled")
TERMINAL_STATUSES = ("completed", "failed", "cancelled")
_CHUNK = 65536


class Cut(enum.Enum):
    """How a proxy cuts its link. `REFUSE` closes every relayed connection and refuses new
    ones, as a stopped server or a reset does; `BLACKHOLE` keeps every connection open and
    accepts new ones but forwards nothing, as a network that silently drops packets does."""

    REFUSE = "refuse"
    BLACKHOLE = "blackhole"


class Proxy:
    """A loopback TCP proxy on its own thread and event loop, to one or more upstreams: each
    new connection goes to the next upstream that accepts it (round robin), so several
    replicas behind it look like one address behind a load balancer.

    `cut(how)` partitions the link; `heal()` restores it. After a blackhole heals, the bytes
    held back flow on, as a network's retransmissions deliver them once it recovers."""

    def __init__(self, upstreams: Sequence[tuple[str, int]], port: int = 0) -> None:
        self._upstreams = list(upstreams)
        self._next = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = port
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self, how: Cut) -> None:
        if how is Cut.REFUSE:
            self._call(self._refuse)
        else:
            self._call(self._blackhole)

    def heal(self) -> None:
        self._call(self._heal)

    def close(self) -> None:
        self._call(self._refuse)
        self._call(self._finish)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, make: Callable[[], object]) -> None:
        async def run() -> None:
            result = make()
            if asyncio.iscoroutine(result):
                await result

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    async def _listen(self) -> None:
        server = await asyncio.start_server(
            self._relay, "127.0.0.1", self.port, reuse_address=True, backlog=256
        )
        self.port = server.sockets[0].getsockname()[1]
        self._server = server

    async def _refuse(self) -> None:
        self._refusing = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        writers, self._writers = self._writers, set()
        for writer in writers:
            _abort(writer)

    async def _finish(self) -> None:
        """Ends every relay still running (a blackholed one waits for ever), and again those
        started meanwhile: a connection the closing server had accepted starts its relay only
        at a later turn of the loop, and a relay never run would leave its socket open."""
        while relays := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
        # An aborted transport closes its socket in a callback of the next loop iteration.
        await asyncio.sleep(0)

    def _blackhole(self) -> None:
        self._flowing.clear()

    async def _heal(self) -> None:
        self._flowing.set()
        if self._refusing:
            self._refusing = False
            await self._listen()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pair = [writer]
        try:
            # Refused before and after connecting upstream: the cut may come in between.
            upstream = None if self._refusing else await self._connect()
            if upstream is None or self._refusing:
                return
            up_reader, up_writer = upstream
            pair.append(up_writer)
            self._writers.update(pair)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            # Cancelled (the proxy closing) or done: neither socket outlives the relay.
            for end in pair:
                _abort(end)
            self._writers.difference_update(pair)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in self._upstreams:
            host, port = self._upstreams[next(self._next) % len(self._upstreams)]
            with contextlib.suppress(OSError):
                return await asyncio.open_connection(host, port)
        return None

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while True:
                    await self._flowing.wait()
                    data = await source.read(_CHUNK)
                    if not data:
                        break
                    # Held here while blackholed: nothing read is lost, nothing more is read.
                    await self._flowing.wait()
                    sink.write(data)
                    await sink.drain()
        finally:
            _abort(sink)


def _abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.transport.abort()


# -- PostgreSQL ----------------------------------------------------------------------------


@contextlib.contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of its own (`harness.postgres`), started, on a free port; stopped
    and removed afterwards."""
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("initdb is not installed: cannot create a private PostgreSQL cluster")
    with postgres.private_cluster(bindir, prefix="chaos-pg-") as cluster:
        yield cluster


def connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url, autocommit=True, connect_timeout=3)


@dataclass(frozen=True, slots=True)
class Ledger:
    """What the database says of every execution: its status, and its event log's shape."""

    statuses: dict[str, str]
    terminal_events: dict[str, int]
    seq_gaps: int
    """Executions whose `event_seq` values are not exactly 1..last_event_seq."""
    seq_duplicates: int

    @property
    def unfinished(self) -> list[str]:
        return sorted(i for i, s in self.statuses.items() if s not in TERMINAL_STATUSES)

    @property
    def double_terminal(self) -> list[str]:
        return sorted(i for i, n in self.terminal_events.items() if n > 1)

    def count(self, status: str) -> int:
        return sum(1 for s in self.statuses.values() if s == status)


_LEDGER = """
    SELECT e.id, e.status, e.last_event_seq,
        count(v.event_seq), count(DISTINCT v.event_seq),
        coalesce(min(v.event_seq), 0), coalesce(max(v.event_seq), 0),
        count(*) FILTER (WHERE v.type = ANY(%s))
    FROM executions e LEFT JOIN events v ON v.execution_id = e.id
    GROUP BY e.id
"""


def ledger(url: str) -> Ledger:
    with connect(url) as conn:
        rows = conn.execute(_LEDGER, (list(TERMINAL_EVENTS),)).fetchall()
    statuses, terminal, gaps, duplicates = {}, {}, 0, 0
    for row in rows:
        execution_id, status, last, events, distinct, low, high, ended = row
        assert isinstance(execution_id, str) and isinstance(status, str)
        statuses[execution_id] = status
        terminal[execution_id] = int(str(ended))
        duplicates += events != distinct
        gaps += not (low == 1 and high == last == distinct)
    return Ledger(statuses, terminal, gaps, duplicates)


def wait_drained(url: str, timeout: float) -> Ledger:
    """The ledger once no execution is unfinished, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = ledger(url)
        if not found.unfinished or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


# -- replicas and the agent ----------------------------------------------------------------


class ThinkingAgent(Process):
    """`python -m chaos.thinking_agent` serving its webhook on `port`, calling `kernel_url`."""

    def __init__(self, kernel_url: str, port: int, log: Path) -> None:
        env = {
            "REBUNO_URL": kernel_url,
            "REBUNO_AGENT_SECRET": SECRET,
            "CHAOS_AGENT_ID": AGENT_ID,
            "CHAOS_PORT": str(port),
        }
        super().__init__([sys.executable, "-m", "chaos.thinking_agent"], log, env)
        self.port = port

    def wait_listening(self, timeout: float = 30) -> None:
        self.wait_for_port(self.port, timeout)


def write_manifest(workdir: Path, agent_port: int) -> Path:
    """The thinking agent's manifest, with the kernel's default (short) lease."""
    path = workdir / "rebuno.yaml"
    path.write_text(
        f"agents:\n  - id: {AGENT_ID}\n"
        f"    webhook_url: http://127.0.0.1:{agent_port}/webhook\n"
        f"    secret: {SECRET}\n"
    )
    return path


def replica_id(server: Server) -> str:
    """The id the replica claims dispatches under (`locked_by`): the kernel's default."""
    return f"{socket.gethostname()}-{server.proc.pid}"


@dataclass
class Fleet:
    """Replicas of `rebuno server` on one database, each on a fixed port, and the thinking
    agent, whose kernel calls go through a balancer over every replica. A replica killed is
    started again on its own port, so the balancer's list never changes."""

    db_urls: list[str]
    workdir: Path
    env: Mapping[str, str]
    agent_port: int = field(default_factory=free_port)
    ports: list[int] = field(default_factory=list)
    replicas: list[Server | None] = field(default_factory=list)
    balancer: Proxy | None = None
    agent: ThinkingAgent | None = None
    starts: list[int] = field(default_factory=list)
    """How many times each replica was started."""

    def start(self) -> None:
        manifest = write_manifest(self.workdir, self.agent_port)
        self._manifest = manifest
        self.ports = [free_port() for _ in self.db_urls]
        self.replicas = [None] * len(self.db_urls)
        self.starts = [0] * len(self.db_urls)
        # Side by side: a replica takes seconds to boot on a busy machine.
        with ThreadPoolExecutor(len(self.db_urls)) as pool:
            list(pool.map(self.restart, range(len(self.db_urls))))
        self.balancer = Proxy([("127.0.0.1", port) for port in self.ports])
        self.agent = ThinkingAgent(self.balancer.url, self.agent_port, self.workdir / "agent.log")
        self.agent.wait_listening()

    def restart(self, index: int) -> Server:
        self.starts[index] += 1
        log = self.workdir / f"replica-{index + 1}.{self.starts[index]}.log"
        server = Server(
            self.db_urls[index],
            TOKEN,
            log,
            manifest=self._manifest,
            env={**FAST_RECOVERY, **self.env},
            port=self.ports[index],
        )
        self.replicas[index] = server
        return server

    def kill(self, index: int) -> Server:
        server = self.replicas[index]
        assert server is not None
        server.kill()
        self.replicas[index] = None
        return server

    def live(self) -> list[Server]:
        return [server for server in self.replicas if server is not None]

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        for server in self.live():
            server.stop()
        if self.balancer is not None:
            self.balancer.close()


@contextlib.contextmanager
def fleet(db_urls: list[str], workdir: Path, env: Mapping[str, str]) -> Iterator[Fleet]:
    running = Fleet(db_urls, workdir, env)
    try:
        running.start()
        yield running
    finally:
        running.stop()


class Creator:
    """Creates executions of the thinking agent at a steady rate on a thread, each on the
    next live replica (as clients spread over a service): `ids` are those the kernel answered
    with; `failed` counts creations that got no answer or a 5xx."""

    def __init__(
        self,
        targets: Callable[[], list[str]],
        rate: float,
        input: object,
        limit: int | None = None,
    ) -> None:
        """`limit`: stop once that many creations were answered."""
        self.ids: list[str] = []
        self.done = threading.Event()
        self._limit = limit
        self.failed = 0
        self._targets = targets
        self._interval = 1 / rate
        self._input = input
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._http = httpx.Client(timeout=5, headers={"Authorization": f"Bearer {TOKEN}"})
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._http.close()

    def _run(self) -> None:
        body = {"agent_id": AGENT_ID, "input": self._input}
        for turn in itertools.count():
            began = time.monotonic()
            targets = self._targets()
            if targets:
                url = targets[turn % len(targets)]
                try:
                    response = self._http.post(f"{url}/v0/executions", json=body)
                    response.raise_for_status()
                    self.ids.append(response.json()["id"])
                except httpx.HTTPError:
                    self.failed += 1
            if self._limit is not None and len(self.ids) >= self._limit:
                self.done.set()
                return
            if self._stop.wait(max(0.0, self._interval - (time.monotonic() - began))):
                return


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (`share` in 0..1) of `values`; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]
