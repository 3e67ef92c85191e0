"""The report of a run: figures derived from others (step cost in commit floors, and against the
bare reference), the targets, the printed table and the JSON document. A and B, and D with B,
have a figure per agent mode (bench/modes.py): the headline's in full, the other modes' beside
the headline's for the rows of `MODE_ROWS` and every judged one. Standard library and the
bench's own modules only.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.modes import HEADLINE, MODES, Mode, split
from bench.outcome import Outcome
from bench.sizes import Sizes
from bench.stats import Figure

LABELS = {
    "A.latency_median": "A latency, median (client)",
    "A.latency_p99": "A latency, p99 (client)",
    "A.latency_per_step": "A per step = latency median / steps",
    "A.latency_marginal_per_step": "A per step, marginal over a 0-step run",
    "A.latency_empty_median": "A 0-step latency, median (client)",
    "A.span_median": "A kernel span, median",
    "A.span_p99": "A kernel span, p99",
    "A.span_per_step": "A per step = span median / steps",
    "A.span_marginal_per_step": "A per step, marginal span (target)",
    "A.step_in_pg_commits": "A marginal step / PG commit floor (target)",
    "A.span_empty_median": "A 0-step kernel span, median",
    "A.step_in_reference": "A marginal step / bare reference step",
    "A.span_marginal_scaled": "A marginal span, scaled by the reference",
    "B.executions_per_s": "B executions/s",
    "B.steps_per_s": "B steps/s",
    "B.rate_in_reference": "B steps/s / bare reference steps/s (target)",
    "B.latency_median": "B latency, median (client)",
    "B.latency_p99": "B latency, p99 (client)",
    "B.span_median": "B kernel span, median",
    "B.span_p99": "B kernel span, p99",
    "B.step_in_pg_commits": "B time per step / PG commit floor",
    "B.steps_per_s_scaled": "B steps/s, scaled by the reference",
    "C.recovery": "C restart to completion (kernel record)",
    "C.recovery_seen_by_client": "C restart to completion (client wait)",
    "D.kernel_peak_rss_mib": "D kernel peak RSS",
    "D.postgres_peak_rss_mib": "D PostgreSQL peak RSS, summed",
    "D.postgres_peak_pss_mib": "D PostgreSQL peak PSS, summed",
    "D.agent_peak_rss_mib": "D agent peak RSS",
    "D.client_peak_rss_mib": "D client peak RSS",
    "D.cpu_kernel_per_step": "D kernel CPU per step",
    "D.cpu_postgres_per_step": "D PostgreSQL CPU per step",
    "D.cpu_agent_per_step": "D agent CPU per step",
    "D.cpu_client_per_step": "D client CPU per step",
    "D.cpu_sampler_per_step": "D harness sampler CPU per step",
    "E.replay_per_step_spread": "E replay per step, spread over sizes",
    "E.replay_rest_per_step_spread": "E replay per step after the first, spread",
    "E.fresh_replay_per_step_spread": "E new process: replay per step, spread",
    "E.fresh_replay_rest_per_step_spread": "E new process: per step after the first, spread",
    "F.dispatch_median": "F dispatch latency, median",
    "F.dispatch_p99": "F dispatch latency, p99",
    "floor.postgres_commit": "PostgreSQL INSERT+COMMIT, one client",
    "floor.sqlite_commit": "SQLite INSERT+COMMIT (WAL, NORMAL)",
    "reference.sqlite_step": "bare reference, SQLite: one step, one client",
    "reference.sqlite_steps_per_s": "bare reference, SQLite: steps/s, B's clients",
    "reference.postgres_step": "bare reference, PostgreSQL: one step, one client",
    "reference.postgres_steps_per_s": "bare reference, PostgreSQL: steps/s, B's clients",
}
MODE_ROWS = (
    "A.latency_median",
    "A.span_marginal_per_step",
    "A.step_in_pg_commits",
    "B.steps_per_s",
    "B.rate_in_reference",
    "B.latency_median",
    "D.cpu_kernel_per_step",
    "D.cpu_postgres_per_step",
    "D.cpu_agent_per_step",
    "D.cpu_client_per_step",
)
"""The rows printed for the modes besides the headline, besides every judged one (the JSON has
all their figures)."""
_MODE_SUFFIX = {"governed": "governed", "batched": "batched, not judged"}
REFERENCE_ON_TARGET_MACHINE = {"sqlite": (0.54, 3000.0), "postgres": (1.0, 2400.0)}
"""What the bare reference (bench/reference.py) did on the machine the targets were set on:
ms per step with one client, steps/s with 16. A figure "scaled by the reference" is ours
times (that / the reference measured in this run): on a slower or busier machine it says
what the figure would have been there."""
_PATTERNS = {
    "E.record_per_step_": "E first run per step, {} steps",
    "E.replay_per_step_": "E replay per step, {} steps",
    "E.replay_first_step_": "E replay, first step, {} steps",
    "E.replay_rest_per_step_": "E replay per step after the first, {} steps",
    "E.replay_wait_": "E grant to replayed, {} steps",
    "E.fresh_replay_per_step_": "E new process: replay per step, {} steps",
    "E.fresh_replay_first_step_": "E new process: first step, {} steps",
    "E.fresh_replay_rest_per_step_": "E new process: per step after the first, {} steps",
    "E.fresh_replay_wait_": "E new process: grant to replayed, {} steps",
}
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


@dataclass(frozen=True, slots=True)
class Target:
    op: str
    limit: float

    def met(self, value: float) -> bool:
        return math.isfinite(value) and _OPS[self.op](value, self.limit)

    def __str__(self) -> str:
        return f"{self.op} {self.limit:g}"


def targets() -> dict[str, dict[str, Target]]:
    """The targets per figure (its headline key) and store, as bench/README.md states them.
    The ratios hold on any machine: they compare with baselines measured in the same run.
    They are PostgreSQL's: both baselines are PostgreSQL commits (the SQLite reference, two
    in-process commits of a few microseconds and no kernel logic, is no yardstick for a
    kernel, and its ratio is shown unjudged)."""
    both = ("sqlite", "postgres")
    return {
        "A.span_marginal_per_step": {"sqlite": Target("<=", 0.5), "postgres": Target("<=", 1.0)},
        "A.step_in_pg_commits": {"postgres": Target("<=", 3)},
        "B.steps_per_s": {"sqlite": Target(">=", 3000), "postgres": Target(">=", 2500)},
        "B.rate_in_reference": {"postgres": Target(">=", 1.2)},
        "C.recovery": dict.fromkeys(both, Target("<=", 1.0)),
        "D.kernel_peak_rss_mib": dict.fromkeys(both, Target("<=", 150)),
        "E.replay_per_step_spread": dict.fromkeys(both, Target("<=", 20)),
        "F.dispatch_median": dict.fromkeys(both, Target("<=", 5)),
    }


def goal(key: str, store: str) -> Target | None:
    """The target `key` is judged against on `store`: none in a mode that is not judged."""
    base, mode = split(key)
    return targets().get(base, {}).get(store) if mode.judged else None


@dataclass(slots=True)
class Report:
    sizes: Sizes
    stores: dict[str, Outcome] = field(default_factory=dict)
    floor: Outcome = field(default_factory=Outcome)
    errors: dict[str, str] = field(default_factory=dict)

    def outcome(self, store: str) -> Outcome:
        return self.stores.setdefault(store, Outcome())

    def derive(self) -> None:
        for store, outcome in self.stores.items():
            for mode in MODES:
                self._in_commit_floors(outcome, mode)
                self._in_reference(store, outcome, mode)

    def _in_reference(self, store: str, outcome: Outcome, mode: Mode) -> None:
        """Step cost and rate against the bare reference of the same store and run."""
        step = self.floor.figures.get(f"reference.{store}_step")
        rate = self.floor.figures.get(f"reference.{store}_steps_per_s")
        there_step, there_rate = REFERENCE_ON_TARGET_MACHINE[store]
        a, b = mode.key("A"), mode.key("B")
        marginal = outcome.figures.get(f"{a}.span_marginal_per_step")
        if step is not None and marginal is not None and step.value > 0:
            in_reference = [rep / step.value for rep in marginal.reps]
            outcome.add(f"{a}.step_in_reference", "x", in_reference)
            scale = there_step / step.value
            outcome.add(f"{a}.span_marginal_scaled", "ms", [rep * scale for rep in marginal.reps])
        ours = outcome.figures.get(f"{b}.steps_per_s")
        if rate is not None and ours is not None and rate.value > 0:
            outcome.add(f"{b}.rate_in_reference", "x", [rep / rate.value for rep in ours.reps])
            scale = there_rate / rate.value
            outcome.add(f"{b}.steps_per_s_scaled", "1/s", [rep * scale for rep in ours.reps])

    def _in_commit_floors(self, outcome: Outcome, mode: Mode) -> None:
        """Step costs as multiples of PostgreSQL's single-client commit."""
        floor = self.floor.figures.get("floor.postgres_commit")
        if floor is None or not math.isfinite(floor.value):
            return
        floor_ms = floor.value / 1000
        a, b = mode.key("A"), mode.key("B")
        marginal = outcome.figures.get(f"{a}.span_marginal_per_step")
        if marginal is not None:
            outcome.add(f"{a}.step_in_pg_commits", "x", [rep / floor_ms for rep in marginal.reps])
        rate = outcome.figures.get(f"{b}.steps_per_s")
        if rate is not None:
            multiples = [1000 / rep / floor_ms for rep in rate.reps]
            outcome.add(f"{b}.step_in_pg_commits", "x", multiples)

    def table(self) -> str:
        stores = list(self.stores)
        header = ["figure", "unit", *stores, "target"]
        rows = [header]
        for key in self._keys():
            cells = [label(key), self._unit(key)]
            cells += [_cell(self.stores[s].figures.get(key), goal(key, s)) for s in stores]
            judged = [(s, t) for s in stores if (t := goal(key, s)) is not None]
            cells.append(" / ".join(f"{s} {t}" for s, t in judged))
            rows.append(cells)
        for key, item in self.floor.figures.items():
            rows.append([label(key), item.unit, _cell(item, None), *[""] * len(stores)])
        return _render(rows) + self._footer()

    def as_json(self) -> dict[str, Any]:
        return {
            "sizes": self.sizes.as_json(),
            "modes": {
                mode.name: {
                    "example_key": f"{mode.key('A')}.span_marginal_per_step",
                    "durability": mode.durability or "default",
                    "policy": mode.policy,
                    "judged": mode.judged,
                }
                for mode in MODES
            },
            "baselines": {k: f.as_json() for k, f in self.floor.figures.items()},
            "stores": {
                store: {
                    "figures": {k: _json(f, goal(k, store)) for k, f in o.figures.items()},
                    "details": o.details,
                }
                for store, o in self.stores.items()
            },
            "targets": {k: {s: str(t) for s, t in v.items()} for k, v in targets().items()},
            "errors": self.errors,
        }

    def _keys(self) -> list[str]:
        """The table's rows: every figure of the headline mode, and of the others those of
        `MODE_ROWS` and the judged ones."""
        keys: dict[str, None] = {}
        for outcome in self.stores.values():
            keys.update(dict.fromkeys(key for key in outcome.figures if _printed(key)))
        return sorted(keys, key=_order)

    def _unit(self, key: str) -> str:
        for outcome in self.stores.values():
            if key in outcome.figures:
                return outcome.figures[key].unit
        return ""

    def _footer(self) -> str:
        lines = ["", "", "modes of A, B and D:"]
        lines += [f"  {mode.name}: {mode.caption}" for mode in MODES]
        lines.append("")
        for store, outcome in self.stores.items():
            for key, value in outcome.details.items():
                if not isinstance(value, list | dict):
                    lines.append(f"{store}: {key} = {value}")
        lines += [f"ERROR {where}: {text}" for where, text in self.errors.items()]
        return "\n".join(lines)


def label(key: str) -> str:
    """The row's name; a mode besides the headline is named after the figure's."""
    base, mode = split(key)
    text = _base_label(base)
    if mode is HEADLINE:
        return text
    if not mode.judged:
        text = text.removesuffix(" (target)")
    return f"{text} [{_MODE_SUFFIX.get(mode.name, mode.name)}]"


def _base_label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    for prefix, pattern in _PATTERNS.items():
        if key.startswith(prefix):
            return pattern.format(f"{int(key[len(prefix) :]):,}")
    return key


def _printed(key: str) -> bool:
    base, mode = split(key)
    return mode is HEADLINE or base in MODE_ROWS or (mode.judged and base in targets())


def _order(key: str) -> tuple[str, int, int, int, str]:
    """Scenario letter, then the LABELS order, then the patterns' order and sizes; each
    figure's modes together, the headline first."""
    base, mode = split(key)
    letter, rank = base.split(".")[0], MODES.index(mode)
    if base in LABELS:
        return letter, list(LABELS).index(base), 0, rank, ""
    for index, prefix in enumerate(_PATTERNS, start=len(LABELS)):
        size = base[len(prefix) :]
        if base.startswith(prefix) and size.isdigit():
            return letter, index, int(size), rank, ""
    return letter, len(LABELS) + len(_PATTERNS), 0, rank, base


def _cell(item: Figure | None, target: Target | None) -> str:
    if item is None:
        return ""
    text = _number(item.value)
    if len(item.reps) > 1:
        text += f" [{_number(item.low)}-{_number(item.high)}]"
    if target is not None:
        text += " ok" if target.met(item.value) else " MISS"
    return text


def _json(item: Figure, target: Target | None) -> dict[str, object]:
    body = item.as_json()
    if target is not None:
        body["target"] = str(target)
        body["met"] = target.met(item.value)
    return body


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _render(rows: Iterable[list[str]]) -> str:
    rows = list(rows)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def merge(into: Outcome, outcome: Outcome) -> None:
    into.figures.update(outcome.figures)
    into.details.update(outcome.details)
