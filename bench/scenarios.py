"""The steady-state scenarios: A (sequential latency), B with D (throughput, and the resources
used meanwhile) and F (dispatch latency). Each runs on its own rig, with the agent in the
context's mode (bench/modes.py), and repeats `sizes.reps` times on it after a warm-up.

Imports only the bench's own modules, the public SDK (through `workload`) and the stdlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator

from bench.outcome import Context, Outcome
from bench.processes import AgentOptions
from bench.profiles import Profiler
from bench.resources import CpuMeter, Sampler, postgres_pids, with_children
from bench.rig import Rig, rig
from bench.stats import median, percentile
from bench.workload import Run, concurrent, sequential

MS = 1000.0
MIB = 1024.0


def warm_up(current: Rig, ctx: Context, steps: int, clients: int = 1) -> None:
    """Executions that are not measured: first connections, imports, caches. `warmup` per
    client, so that with many clients the kernel's pool has grown and every connection has
    prepared its statements before anything is measured."""
    count = ctx.sizes.warmup * clients
    timeout = ctx.sizes.wait_timeout
    asyncio.run(concurrent(current.kernel.url, current.token, clients, count, steps, timeout))


def interleaved(full: int, steps: int, empty: int) -> list[int]:
    """`full` executions of `steps` steps with `empty` 0-step ones spread evenly among them,
    so drift in the machine hits both kinds alike."""
    slots = [(i / full, steps) for i in range(full)]
    slots += [((i + 0.5) / empty, 0) for i in range(empty)]
    return [steps for _, steps in sorted(slots)]


@contextlib.contextmanager
def modal_rig(ctx: Context, name: str) -> Iterator[Rig]:
    """The rig of scenario `name` in the context's mode: its agent's options and policy."""
    mode = ctx.mode
    workdir = ctx.workdir / mode.key(name).replace(".", "-")
    options = AgentOptions(durability=mode.durability)
    with rig(ctx.store, workdir, {}, ctx.sizes, policy=mode.policy, options=options) as current:
        yield current


@contextlib.contextmanager
def profiled(current: Rig, ctx: Context, name: str) -> Iterator[None]:
    """py-spy on the kernel and the agent while the block runs, when profiling was asked for."""
    if ctx.profile_dir is None:
        yield
        return
    target = ctx.profile_dir / f"{ctx.store}-{ctx.mode.key(name).replace('.', '-')}"
    with Profiler({"kernel": current.kernel.pid, "agent": current.agent.pid}, target):
        yield


def sequential_latency(ctx: Context) -> Outcome:
    """A: one execution at a time; client-observed latency and the kernel's own span. F: the
    dispatch latency of the same executions (nothing else runs meanwhile)."""
    sizes, outcome = ctx.sizes, Outcome()
    plan = interleaved(sizes.a_executions, sizes.a_steps, sizes.a_empty_executions)
    with modal_rig(ctx, "A") as current:
        warm_up(current, ctx, sizes.a_steps)
        current.new_marks()
        reps, dispatches = [], []
        with profiled(current, ctx, "A"):
            for _ in range(sizes.reps):
                url, token = current.kernel.url, current.token
                runs = asyncio.run(sequential(url, token, plan, sizes.wait_timeout))
                reps.append(_latency_figures(runs, sizes.a_steps))
                dispatches.append(_dispatch_figures(current, runs))
    outcome.add_from(reps, dict.fromkeys(reps[0], "ms"), ctx.mode.key("A"))
    outcome.add_from(dispatches, dict.fromkeys(dispatches[0], "ms"), ctx.mode.key("F"))
    return outcome


def _latency_figures(runs: list[Run], steps: int) -> dict[str, float]:
    full = [run for run in runs if run.steps == steps]
    empty = [run for run in runs if run.steps == 0]
    figures: dict[str, float] = {}
    for basis, of in (("latency", _latency), ("span", _span)):
        values = [of(run) for run in full]
        zero = median([of(run) for run in empty])
        figures[f"{basis}_median"] = median(values)
        figures[f"{basis}_p99"] = percentile(values, 99)
        figures[f"{basis}_empty_median"] = zero
        figures[f"{basis}_per_step"] = median(values) / steps
        figures[f"{basis}_marginal_per_step"] = (median(values) - zero) / steps
    return figures


def _latency(run: Run) -> float:
    return run.latency * MS


def _span(run: Run) -> float:
    return run.span * MS


def throughput(ctx: Context) -> Outcome:
    """B: concurrent clients; D: peak memory and CPU per step of every process meanwhile."""
    sizes, outcome = ctx.sizes, Outcome()
    with modal_rig(ctx, "B") as current:
        warm_up(current, ctx, sizes.b_steps, sizes.b_clients)
        with profiled(current, ctx, "B"):
            reps = [_throughput_rep(current, ctx) for _ in range(sizes.reps)]
    units = {
        "executions_per_s": "1/s",
        "steps_per_s": "1/s",
        "latency_median": "ms",
        "latency_p99": "ms",
        "span_median": "ms",
        "span_p99": "ms",
    }
    outcome.add_from(reps, units, ctx.mode.key("B"))
    resources = {key: "MiB" for key in reps[0] if key.endswith("_mib")}
    resources |= {key: "ms" for key in reps[0] if key.startswith("cpu_")}
    outcome.add_from(reps, resources, ctx.mode.key("D"))
    return outcome


def _throughput_rep(current: Rig, ctx: Context) -> dict[str, float]:
    sizes = ctx.sizes
    groups = _process_groups(current)
    meter = CpuMeter(groups)
    meter.start()
    with Sampler(groups) as sampler:
        runs, wall = asyncio.run(
            concurrent(
                current.kernel.url,
                current.token,
                sizes.b_clients,
                sizes.b_executions,
                sizes.b_steps,
                sizes.wait_timeout,
            )
        )
    meter.stop()
    # The sampler runs in the client's process; its own CPU is reported apart.
    meter.used["client"] -= sampler.cpu_seconds
    meter.used["sampler"] = sampler.cpu_seconds
    steps = sizes.b_executions * sizes.b_steps
    figures = {
        "executions_per_s": len(runs) / wall,
        "steps_per_s": steps / wall,
        "latency_median": median([_latency(run) for run in runs]),
        "latency_p99": percentile([_latency(run) for run in runs], 99),
        "span_median": median([_span(run) for run in runs]),
        "span_p99": percentile([_span(run) for run in runs], 99),
    }
    for name in groups:
        figures[f"{name}_peak_rss_mib"] = sampler.peaks.rss_kb[name] / MIB
    for name, used in meter.used.items():
        figures[f"cpu_{name}_per_step"] = used * MS / steps
    if current.database:
        figures["postgres_peak_pss_mib"] = sampler.peaks.pss_kb["postgres"] / MIB
    return figures


def _process_groups(current: Rig) -> dict[str, _Pids]:
    groups = {
        "kernel": _Pids(with_children(current.kernel.pid)),
        "agent": _Pids([current.agent.pid]),
        "client": _Pids([os.getpid()]),
    }
    if current.database:
        groups["postgres"] = _Pids(database=current.database)
    return groups


class _Pids:
    """A fixed list of pids, or PostgreSQL's processes for one database, rescanned at most
    once a second (a /proc scan is far dearer than a sample)."""

    def __init__(self, fixed: list[int] | None = None, database: str = "") -> None:
        self._fixed = fixed or []
        self._database = database
        self._cached: list[int] = []
        self._scanned = -1.0

    def __call__(self) -> list[int]:
        if not self._database:
            return self._fixed
        now = time.monotonic()
        if now - self._scanned >= 1.0:
            self._cached, self._scanned = postgres_pids(self._database), now
        return self._cached


def _dispatch_figures(current: Rig, runs: list[Run]) -> dict[str, float]:
    """F, from the same executions: webhook arrival at the agent minus `create` returning."""
    arrivals: dict[str, int] = {}
    for mark in current.new_marks():
        if mark["ev"] == "arrive":
            arrivals.setdefault(mark["execution_id"], mark["t"])
    delays = [(arrivals[run.execution_id] - run.created_ns) / 1e6 for run in runs]
    return {"dispatch_median": median(delays), "dispatch_p99": percentile(delays, 99)}
