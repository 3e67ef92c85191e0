"""Policy test suites (§35): cases with expected decisions, run through a compiled `Bundle`.

A case is the input a new step would bring (`agent_id`, `kind`, `target`, `args`), with the
decision and the rule it should get. `run_cases` evaluates each one with `Bundle.evaluate`,
the very evaluation that decides a submitted step, so a suite passes only for what the kernel
would decide. `replay_cases` turns the steps an execution recorded into cases that expect what
was decided then; `read_case` and `load_case_file` normalise cases sent over HTTP or written
in a `.policytest.yaml` file. Rate limits, budgets and approvals are stateful and never
consulted here: nothing is read or written.

Must not import the store, the services or the API (yaml only through the loader).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.records import Event, Execution, RawJson, Step
from rebuno.kernel.policy.engine import Bundle, PolicyResult
from rebuno.kernel.policy.loader import (
    BundleInvalid,
    closest_key,
    line_and_column,
    parse_yaml,
)
from rebuno.protocol.canonical import JsonNumber, dumps
from rebuno.protocol.enums import PolicyAction, StepKind
from rebuno.protocol.events import EventType

CASE_KEYS: Final = frozenset(
    {"name", "agent_id", "kind", "target", "args", "expect", "expect_rule"}
)
_FILE_KEYS: Final = frozenset({"agent_id", "cases"})
FIXED_RULES: Final = frozenset({"default", "local", "permissive"})
"""Rule ids no bundle declares: they never count as unexercised."""
_EXPECTED: Final = {
    EventType.STEP_ALLOWED.value: PolicyAction.ALLOW,
    EventType.STEP_DENIED.value: PolicyAction.DENY,
    EventType.STEP_AWAITING_APPROVAL.value: PolicyAction.REQUIRE_APPROVAL,
}
DECISION_EVENTS: Final = tuple(_EXPECTED)
"""The event types that record a step's decision, the first of which a replay expects."""
_LABEL_ARGS: Final = 200


class CaseInvalid(ValidationFailed):
    """A case (or a case file) that cannot be run; `problem` is the message without the
    API's `validation error: ` prefix, for the CLI to place after a file name."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"validation error: {problem}")
        self.problem = problem


@dataclass(frozen=True, slots=True)
class PolicyCase:
    """One input to evaluate. `args`: canonical JSON text of an object, or None. The replay
    fields (`execution_id`, `step_id`, `was_rule`) are empty for a written case."""

    target: str
    agent_id: str = ""
    kind: StepKind = StepKind.TOOL_CALL
    args: RawJson | None = None
    name: str = ""
    expect: PolicyAction | None = None
    expect_rule: str = ""
    execution_id: str = ""
    step_id: str = ""
    was_rule: str = ""

    @property
    def label(self) -> str:
        """The name, or the target with the compact JSON of its args."""
        if self.name:
            return self.name
        if self.args is None:
            return self.target
        args = self.args if len(self.args) <= _LABEL_ARGS else self.args[:_LABEL_ARGS] + "…"
        return f"{self.target} {args}"


@dataclass(frozen=True, slots=True)
class CaseResult:
    """A case and what the bundle decided; `failure` is None when the case passed."""

    case: PolicyCase
    result: PolicyResult
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None


@dataclass(frozen=True, slots=True)
class PolicyReport:
    results: tuple[CaseResult, ...]
    unexercised_rules: tuple[str, ...]
    policy_hash: str

    @property
    def failed(self) -> int:
        return sum(not result.passed for result in self.results)


def run_cases(bundle: Bundle, bundle_hash: str, cases: Iterable[PolicyCase]) -> PolicyReport:
    """Each case through `bundle.evaluate`; which of its rules no case reached, in order."""
    results = tuple(_run(bundle, case) for case in cases)
    reached = {result.result.rule_id for result in results}
    unexercised = tuple(
        rule.id for rule in bundle.rules if rule.id not in reached and rule.id not in FIXED_RULES
    )
    return PolicyReport(results, unexercised, bundle_hash)


def _run(bundle: Bundle, case: PolicyCase) -> CaseResult:
    result = bundle.evaluate(case.agent_id, case.kind, case.target, case.args)
    if case.expect is not None and result.action is not case.expect:
        return CaseResult(case, result, f"{result.action.value}, want {case.expect.value}")
    if case.expect_rule and result.rule_id != case.expect_rule:
        return CaseResult(case, result, f"rule {result.rule_id}, want {case.expect_rule}")
    return CaseResult(case, result)


def report_fields(report: PolicyReport, raw: Callable[[RawJson], object]) -> dict[str, Any]:
    """The report as §35.1 renders it; `raw` turns a case's args (JSON text) into a value."""
    return {
        "results": [_result_fields(result, raw) for result in report.results],
        "failed": report.failed,
        "unexercised_rules": list(report.unexercised_rules),
        "policy_hash": report.policy_hash,
    }


def _result_fields(outcome: CaseResult, raw: Callable[[RawJson], object]) -> dict[str, Any]:
    """The case as normalised (empty fields left out), then what was decided."""
    case, result = outcome.case, outcome.result
    fields: dict[str, Any] = {"name": case.name} if case.name else {}
    fields.update(agent_id=case.agent_id, kind=case.kind.value, target=case.target)
    if case.args is not None:
        fields["args"] = raw(case.args)
    if case.expect is not None:
        fields["expect"] = case.expect.value
    optional = {
        "expect_rule": case.expect_rule,
        "execution_id": case.execution_id,
        "step_id": case.step_id,
        "was_rule": case.was_rule,
    }
    fields.update((key, value) for key, value in optional.items() if value)
    fields.update(decision=result.action.value, rule_id=result.rule_id)
    if result.reason:
        fields["reason"] = result.reason
    fields["pass"] = outcome.passed
    if outcome.failure is not None:
        fields["failure"] = outcome.failure
    return fields


# -- cases from what an execution recorded ---------------------------------------------------
def replay_cases(
    execution: Execution, recorded: Sequence[Step], decisions: Iterable[Event]
) -> list[PolicyCase]:
    """One case per recorded step, in proposal order, expecting the step's first decision
    (a later `step.allowed` from a grant is not the policy's). A kernel decision, which a
    pure evaluation cannot reproduce (an indeterminate retry, a spent budget), expects
    nothing."""
    first: dict[str, tuple[PolicyAction, str, str]] = {}
    for event in decisions:
        expected = _EXPECTED.get(event.type)
        payload = _payload(event)
        step_id = payload.get("step_id")
        if expected is None or not isinstance(step_id, str) or step_id in first:
            continue
        rule_id = payload.get("rule_id")
        error = payload.get("error")
        reason, _ = steps.error_reason(orjson.dumps(error).decode() if error else None)
        first[step_id] = (expected, rule_id if isinstance(rule_id, str) else "", reason)
    return [_replayed(execution, step, first.get(step.step_id)) for step in recorded]


def _payload(event: Event) -> dict[str, Any]:
    try:
        value = orjson.loads(event.payload)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _replayed(
    execution: Execution, step: Step, decided: tuple[PolicyAction, str, str] | None
) -> PolicyCase:
    args = step.args if step.args is not None and step.args.lstrip().startswith("{") else None
    case = PolicyCase(
        target=step.target,
        agent_id=execution.agent_id,
        kind=step.kind,
        args=args,
        execution_id=execution.id,
        step_id=step.step_id,
    )
    if decided is None:
        return case
    expected, rule_id, reason = decided
    case = replace(case, was_rule=rule_id)
    if rule_id == steps.INDETERMINATE_RETRY_RULE or reason == steps.BUDGET_EXCEEDED_REASON:
        return case
    return replace(case, expect=expected)


# -- cases as written ------------------------------------------------------------------------
def read_cases(items: Sequence[object], default_agent: str) -> list[PolicyCase]:
    """Normalised cases, each refused by its 1-based position (`case 2: missing target`)."""
    return [read_case(number, item, default_agent) for number, item in enumerate(items, 1)]


def read_case(number: int, item: object, default_agent: str) -> PolicyCase:
    """One case: a mapping of the known keys; `target` required, `kind` one of the three,
    `expect` a decision, `args` an object. An unknown key is refused: a misspelt `expect`
    would silently turn an assertion into nothing."""
    where = f"case {number}"
    if not isinstance(item, Mapping):
        raise CaseInvalid(f"{where}: must be an object")
    for key in item:
        if key not in CASE_KEYS:
            raise CaseInvalid(f"{where}: {_unknown(str(key), CASE_KEYS)}")
    target = _text(item, "target", where)
    if not target:
        raise CaseInvalid(f"{where}: missing target")
    return PolicyCase(
        target=target,
        agent_id=_text(item, "agent_id", where) or default_agent,
        kind=_kind(item, where),
        args=_args(item, where),
        name=_text(item, "name", where),
        expect=_expect(item, where),
        expect_rule=_text(item, "expect_rule", where),
    )


def _unknown(key: str, known: frozenset[str]) -> str:
    close = closest_key(key, known)
    hint = f"did you mean '{close}'?" if close else f"known: {', '.join(sorted(known))}"
    return f"unknown field '{key}' ({hint})"


def _text(item: Mapping[Any, Any], key: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or isinstance(value, JsonNumber):
        raise CaseInvalid(f"{where}: {key} must be a string")
    if "\x00" in value:
        raise CaseInvalid(f"{where}: {key} must not contain a NUL character")
    return value


def _kind(item: Mapping[Any, Any], where: str) -> StepKind:
    text = _text(item, "kind", where)
    if not text:
        return StepKind.TOOL_CALL
    try:
        return StepKind(text)
    except ValueError:
        kinds = ", ".join(kind.value for kind in StepKind)
        raise CaseInvalid(f"{where}: kind must be one of {kinds} (got '{text}')") from None


def _expect(item: Mapping[Any, Any], where: str) -> PolicyAction | None:
    text = _text(item, "expect", where)
    if not text:
        return None
    try:
        return PolicyAction(text)
    except ValueError:
        actions = ", ".join(action.value for action in PolicyAction)
        raise CaseInvalid(f"{where}: expect must be one of {actions} (got '{text}')") from None


def _args(item: Mapping[Any, Any], where: str) -> RawJson | None:
    value = item.get("args")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CaseInvalid(f"{where}: args must be an object")
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        raise CaseInvalid(f"{where}: args cannot be written as JSON: {exc}") from None


# -- the .policytest.yaml file ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CaseFile:
    agent_id: str
    cases: tuple[PolicyCase, ...]


def load_case_file(text: str, default_agent: str = "") -> CaseFile:
    """§35.4: `agent_id` (optional) and `cases`, read with YAML 1.2 scalars; unknown keys are
    refused at both levels; an empty document has no cases. A case names its agent, else the
    file does, else `default_agent`."""
    try:
        document = parse_yaml(text)
    except BundleInvalid as error:
        place = line_and_column(error.line, error.column).removeprefix(", ")
        raise CaseInvalid(f"{place}: {error.problem}" if place else error.problem) from None
    if document is None:
        return CaseFile("", ())
    if not isinstance(document, dict):
        raise CaseInvalid("the top level must be a mapping")
    for key in document:
        if key not in _FILE_KEYS:
            raise CaseInvalid(_unknown(str(key), _FILE_KEYS))
    agent_id = _text(document, "agent_id", "the file")
    items = document.get("cases")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise CaseInvalid("cases must be a list")
    return CaseFile(agent_id, tuple(read_cases(items, agent_id or default_agent)))
