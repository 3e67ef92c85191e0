"""`rebuno policy test`'s suites (§35.5): a case file run offline through the kernel's own
engine (`rebuno.kernel.policy.suite`), or a recorded execution replayed by a kernel, and the
report printed as one line per case.

Both ways print the same report (the JSON object of §35.1), so a suite run offline and one run
by the kernel read alike. Imports the kernel's policy package and nothing else of the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import orjson

from rebuno.cli.render import Output
from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.policy import Bundle
from rebuno.kernel.policy.suite import (
    CaseInvalid,
    load_case_file,
    report_fields,
    run_cases,
)

LABEL_WIDTH = 56


def default_cases(bundle_path: str) -> Path:
    """The bundle's path with its last extension replaced (`shell.yaml` →
    `shell.policytest.yaml`)."""
    path = Path(bundle_path)
    return path.with_name(f"{path.stem if path.suffix else path.name}.policytest.yaml")


def run_case_file(
    bundle: Bundle, text: str, cases_path: Path, agent_id: str, given: bool
) -> dict[str, Any]:
    """The report of the case file at `cases_path` (`given`: named by `--cases`, so not the
    default one) through `bundle`; a missing, unreadable or empty file is a one-line error."""
    try:
        written = cases_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if given:
            raise click.ClickException(f"cannot read {cases_path}: no such file") from None
        raise click.ClickException(
            f"no test cases: {cases_path} does not exist"
            " (write it, name another file with --cases, or probe one step with --target)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read {cases_path}: {exc}") from None
    try:
        case_file = load_case_file(written, agent_id)
    except CaseInvalid as exc:
        raise click.ClickException(f"{cases_path}: {exc.problem}") from None
    if not case_file.cases:
        raise click.ClickException(f"{cases_path}: no cases")
    report = run_cases(bundle, policy_hash(text), case_file.cases)
    return report_fields(report, orjson.loads)


def print_report(out: Output, report: Mapping[str, Any]) -> None:
    """The report, then exit 1 when a case missed its expectation (§35.5)."""
    results: Sequence[Mapping[str, Any]] = report.get("results") or []
    if out.json:
        out.json_value(dict(report))
    else:
        _table(out, results, report.get("unexercised_rules") or [])
    if any(not result.get("pass", True) for result in results):
        raise click.exceptions.Exit(1)


def _table(out: Output, results: Sequence[Mapping[str, Any]], unexercised: Sequence[str]) -> None:
    rows = [
        (
            "PASS" if result.get("pass", True) else "FAIL",
            _cut(_label(result)),
            str(result.get("failure") or result.get("decision", "")),
            str(result.get("rule_id", "")),
        )
        for result in results
    ]
    label_width = max((len(row[1]) for row in rows), default=0)
    outcome_width = max((len(row[2]) for row in rows), default=0)
    for verdict, label, outcome, rule in rows:
        styled = out.style(verdict, "green" if verdict == "PASS" else "red")
        line = f"  {styled}  {label.ljust(label_width)}  {outcome.ljust(outcome_width)}  {rule}"
        out.line(line.rstrip())
    if unexercised:
        out.line(f"  rules never exercised: {', '.join(unexercised)}")
    failed = sum(row[0] == "FAIL" for row in rows)
    total = len(rows)
    noun = "case" if total == 1 else "cases"
    if failed:
        out.line(f"  {failed} of {total} {noun} failed")
    else:
        out.line(f"  {total} {noun} passed")


def _label(result: Mapping[str, Any]) -> str:
    """The case's name, or its target with the compact JSON of its args."""
    name = result.get("name")
    if name:
        return str(name)
    target = str(result.get("target", ""))
    if "args" not in result:
        return target
    return f"{target} {orjson.dumps(result['args']).decode()}"


def _cut(label: str) -> str:
    label = " ".join(label.split())  # a label is one line of the table
    return label if len(label) <= LABEL_WIDTH else label[: LABEL_WIDTH - 1] + "…"
