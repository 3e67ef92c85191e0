"""`python -m bench` (what `make bench` and `scripts/bench` run): picks the stores, the
scenarios, the agent modes of A and B and the sizes, runs them, prints the table and writes
`bench/results/<time>.json`.

Options come from flags or from the environment (`BENCH_QUICK=1`, `BENCH_STORES`,
`BENCH_SCENARIOS`, `BENCH_MODES`, `BENCH_REPS`), so `make bench BENCH_QUICK=1` works too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.floor import commit_floor
from bench.modes import BY_NAME, HEADLINE, Mode
from bench.outcome import Context, Outcome, Scenario
from bench.processes import ROOT
from bench.recovery import recovery, replay_cost
from bench.reference import reference
from bench.report import Report, merge
from bench.scenarios import sequential_latency, throughput
from bench.sizes import FULL, QUICK, Sizes

STORES = ("sqlite", "postgres")
# D is measured during B's run and F during A's, so asking for either of a pair runs it once.
SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "A": ("AF", sequential_latency),
    "B": ("BD", throughput),
    "D": ("BD", throughput),
    "C": ("C", recovery),
    "E": ("E", replay_cost),
    "F": ("AF", sequential_latency),
}
MODAL = ("AF", "BD")
"""The scenarios that run once per agent mode; the others run in the headline mode."""


def parse(argv: list[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument(
        "--stores", default=env("BENCH_STORES", ",".join(STORES)), help="sqlite,postgres"
    )
    parser.add_argument(
        "--scenarios", default=env("BENCH_SCENARIOS", "A,B,C,D,E,F"), help="any of A-F"
    )
    parser.add_argument(
        "--modes",
        default=env("BENCH_MODES", ",".join(BY_NAME)),
        help="the agent modes of A and B: any of " + ", ".join(BY_NAME),
    )
    parser.add_argument("--quick", action="store_true", default=env("BENCH_QUICK") == "1")
    parser.add_argument("--reps", type=int, default=int(env("BENCH_REPS") or 0) or None)
    parser.add_argument(
        "--set",
        action="append",
        default=[item for item in (env("BENCH_SET") or "").split(",") if item],
        metavar="KNOB=VALUE",
        help="override a size knob of bench/sizes.py, e.g. b_executions=1000",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--profile", type=Path, help="py-spy profiles of A and B into DIR")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return parser.parse_args(argv)


def chosen(text: str, allowed: tuple[str, ...] | list[str]) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return names


def with_knobs(sizes: Sizes, knobs: list[str]) -> Sizes:
    """`sizes` with `name=value` overrides; a tuple knob takes values separated by `/`."""
    fields = {item.name: item for item in dataclasses.fields(sizes)}
    changes: dict[str, object] = {}
    for knob in knobs:
        name, _, text = knob.partition("=")
        if name not in fields or not text:
            raise SystemExit(f"unknown knob {knob!r}: choose from {', '.join(fields)}")
        current = getattr(sizes, name)
        if isinstance(current, tuple):
            changes[name] = tuple(int(part) for part in text.split("/"))
        else:
            changes[name] = type(current)(text)
    return dataclasses.replace(sizes, **changes)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    stores = chosen(args.stores, STORES)
    letters = chosen(args.scenarios.upper(), list(SCENARIOS))
    modes = [BY_NAME[name] for name in chosen(args.modes, list(BY_NAME))]
    sizes = QUICK if args.quick else FULL
    if args.reps:
        sizes = dataclasses.replace(sizes, reps=args.reps)
    sizes = with_knobs(sizes, args.set)
    runs = {SCENARIOS[letter][0]: SCENARIOS[letter][1] for letter in letters}
    scratch = Path(tempfile.mkdtemp(prefix="rebuno-bench-"))
    started, clock = datetime.now(UTC), time.monotonic()
    report = run(stores, runs, modes, sizes, scratch, args.profile)
    report.derive()
    print(report.table())
    document = {
        "started_at": started.isoformat(),
        "duration_s": round(time.monotonic() - clock, 1),
        "host": _host(),
        **report.as_json(),
    }
    path = _write(args.out, started, document)
    print(f"\nwritten to {path} in {document['duration_s']} s")
    if args.keep or report.errors:
        print(f"scratch directory (logs): {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if report.errors else 0


def run(
    stores: list[str],
    runs: dict[str, Scenario],
    modes: list[Mode],
    sizes: Sizes,
    scratch: Path,
    profile: Path | None,
) -> Report:
    report = Report(sizes)
    floor = Context("postgres" if "postgres" in stores else "", scratch, sizes)
    _attempt(report, "floor", commit_floor, floor, report.floor)
    for store in stores:
        bare = Context(store, scratch / store, sizes)
        print(f"[{_clock()}] {store}: reference ...", file=sys.stderr, flush=True)
        _attempt(report, f"{store} reference", reference, bare, report.floor)
        for name, scenario in runs.items():
            for mode in modes if name in MODAL else [HEADLINE]:
                where = f"{store} {name}" + ("" if mode is HEADLINE else f" {mode.name}")
                print(f"[{_clock()}] {where} ...", file=sys.stderr, flush=True)
                ctx = Context(store, scratch / store, _for_mode(sizes, mode), profile, mode)
                _attempt(report, where, scenario, ctx, report.outcome(store))
    return report


def _for_mode(sizes: Sizes, mode: Mode) -> Sizes:
    """The sizes a mode runs with: the modes beside the headline repeat less (`mode_reps`)."""
    if mode is HEADLINE:
        return sizes
    return dataclasses.replace(sizes, reps=min(sizes.reps, sizes.mode_reps))


def _attempt(report: Report, where: str, scenario: Scenario, ctx: Context, into: Outcome) -> None:
    """Runs one scenario; a failure is reported and the run goes on with the next one."""
    try:
        merge(into, scenario(ctx))
    except Exception as exc:
        traceback.print_exc()
        report.errors[where] = f"{type(exc).__name__}: {exc}"[:2000]


def _clock() -> str:
    return datetime.now().strftime("%H:%M:%S")


def _host() -> dict[str, object]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_end": [round(value, 2) for value in load],
    }


def _write(directory: Path, started: datetime, document: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
