"""Runs the fault-injection scenarios and reports: a table on stdout and a JSON document under
`chaos/results/<time>.json`. Exits 1 when any scenario saw an invariant broken.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from chaos.registry import scenarios
from chaos.result import Result, Scale

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--scale", choices=[scale.value for scale in Scale], default="full")
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--out", type=Path, default=ROOT / "chaos" / "results")
    args = parser.parse_args(argv)
    scale = Scale(args.scale)
    chosen = scenarios(args.only.split(",") if args.only else None)
    results: list[Result] = []
    started = time.monotonic()
    for scenario in chosen:
        print(f"== {scenario.NAME}: {scenario.SUMMARY}", flush=True)
        begun = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"chaos-{scenario.NAME}-") as workdir:
            result = scenario.run(scale, Path(workdir))
        result.figures["wall_s"] = round(time.monotonic() - begun, 2)
        results.append(result)
        print(render(result), flush=True)
    print(f"{len(results)} scenario(s) in {time.monotonic() - started:.0f} s", flush=True)
    write(args.out, scale, results)
    return 0 if all(result.passed for result in results) else 1


def render(result: Result) -> str:
    width = max((len(key) for key in result.figures), default=0)
    lines = [f"  {key.ljust(width)}  {value}" for key, value in result.figures.items()]
    lines += [f"  BROKEN: {failure}" for failure in result.failures]
    lines.append(f"  {'ok' if result.passed else 'FAILED'}")
    return "\n".join(lines)


def write(folder: Path, scale: Scale, results: list[Result]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    document = {
        "scale": scale.value,
        "at": stamp,
        "scenarios": [
            {"name": r.name, "passed": r.passed, "figures": r.figures, "failures": r.failures}
            for r in results
        ],
    }
    path = folder / f"{stamp}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", file=sys.stderr)
