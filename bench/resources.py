"""Sampling /proc while a workload runs: peak resident memory and CPU time of the kernel, the
agent, the client and the PostgreSQL server processes that serve the benchmark's database.

PostgreSQL's shared buffers are mapped into every backend, so a plain sum of RSS counts them
once per process; the proportional set size (PSS) sum is reported beside it as the honest
total. Standard library only; Linux only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
_TICKS = os.sysconf("SC_CLK_TCK")
_PG_AUXILIARY = (
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum launcher",
    "logical replication launcher",
    "archiver",
    "stats collector",
)


def rss_kb(pid: int) -> int:
    """Resident set size of `pid` in KiB; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE_KB


def pss_kb(pid: int) -> int:
    """Proportional set size of `pid` in KiB; 0 once it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User plus system CPU time `pid` (or one of its threads) has used so far; 0 once it is
    gone."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        stat = Path(path).read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def with_children(pid: int) -> list[int]:
    """`pid` and its direct children (a supervisor and its workers)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid, *(int(child) for child in children)]


def postgres_pids(database: str) -> list[int]:
    """The postmaster, its auxiliary processes, and the backends connected to `database`."""
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if _serves(cmdline.strip(), database):
            pids.append(int(entry.name))
    return pids


def _serves(cmdline: str, database: str) -> bool:
    if cmdline.startswith("postgres: "):
        title = cmdline.split(": ", 2)[-1]
        return title.startswith(_PG_AUXILIARY) or f" {database} " in f" {title} "
    return "/bin/postgres " in cmdline and " -D " in cmdline


@dataclass(slots=True)
class Peaks:
    """What a sampler saw: peak KiB per watched group, and samples taken."""

    rss_kb: dict[str, int] = field(default_factory=dict)
    pss_kb: dict[str, int] = field(default_factory=dict)
    samples: int = 0


class Sampler:
    """Samples every group of processes every `interval` seconds on a thread until stopped;
    PSS only every `pss_every`-th time, since the kernel walks every mapping to compute it
    (milliseconds per PostgreSQL backend).

    `groups` maps a name to a callable giving the pids to sum (called on every sample, so a
    PostgreSQL backend that appears later is counted). `cpu_seconds` is what the sampling
    thread itself used, so it can be kept apart from the process it runs in."""

    def __init__(
        self,
        groups: Mapping[str, Callable[[], list[int]]],
        interval: float = 0.1,
        pss_every: int = 10,
    ) -> None:
        self._groups = groups
        self._interval = interval
        self._pss_every = pss_every
        self._stop = threading.Event()
        self.peaks = Peaks({name: 0 for name in groups}, {name: 0 for name in groups})
        self.cpu_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        thread = threading.get_native_id()
        while True:
            self._sample()
            self.cpu_seconds = cpu_seconds(os.getpid(), thread)
            if self._stop.wait(self._interval):
                return

    def _sample(self) -> None:
        with_pss = self.peaks.samples % self._pss_every == 0
        for name, pids_of in self._groups.items():
            pids = pids_of()
            rss = sum(rss_kb(pid) for pid in pids)
            self.peaks.rss_kb[name] = max(self.peaks.rss_kb[name], rss)
            if with_pss:
                pss = sum(pss_kb(pid) for pid in pids)
                self.peaks.pss_kb[name] = max(self.peaks.pss_kb[name], pss)
        self.peaks.samples += 1


class CpuMeter:
    """CPU seconds each group used between `start()` and `stop()` (pids fixed at start)."""

    def __init__(self, groups: Mapping[str, Callable[[], list[int]]]) -> None:
        self._groups = groups
        self._pids: dict[str, list[int]] = {}
        self._start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def start(self) -> None:
        self._pids = {name: pids_of() for name, pids_of in self._groups.items()}
        self._start = {name: self._total(pids) for name, pids in self._pids.items()}

    def stop(self) -> None:
        self.used = {
            name: self._total(pids) - self._start[name] for name, pids in self._pids.items()
        }

    @staticmethod
    def _total(pids: list[int]) -> float:
        return sum(cpu_seconds(pid) for pid in pids)
