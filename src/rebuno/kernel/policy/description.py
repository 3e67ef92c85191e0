"""A bundle as a person reads it (§40.6): its rules in evaluation order, each with what it
matches and decides as written, and what it decides for one step (a dry run of the engine).

The bundle is validated by the loader first, so only a bundle the kernel would accept is
described. Must not import yaml (the loader reads it), the store, the services or the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rebuno.kernel.policy.engine import PERMISSIVE, PolicyResult
from rebuno.kernel.policy.loader import load_bundle, parse_yaml
from rebuno.protocol.enums import StepKind


@dataclass(frozen=True, slots=True)
class Probe:
    """A step to try a bundle against: what the engine looks at."""

    agent_id: str
    kind: StepKind
    target: str
    args_json: str | None


def describe_bundle(text: str) -> dict[str, Any]:
    """`{"default_action", "rules": [{"id", "priority"?, "when", "then"}]}`; raises the
    loader's `BundleInvalid` for a bundle it refuses. An empty text is no bundle at all."""
    if not text:
        return {"default_action": None, "rules": []}
    bundle = load_bundle(text)
    document = parse_yaml(text)
    written: dict[str, dict[str, Any]] = {}
    if isinstance(document, dict) and isinstance(document.get("rules"), list):
        for item in document["rules"]:
            if isinstance(item, dict):
                written[str(item.get("id"))] = item
    rules = []
    for rule in bundle.rules:
        source = written.get(rule.id, {})
        described = {"id": rule.id, "when": plain(source.get("when", {}))}
        if "priority" in source:
            described["priority"] = plain(source["priority"])
        described["then"] = plain(source.get("then", {}))
        rules.append(described)
    return {"default_action": bundle.default_action.value, "rules": rules}


def try_bundle(text: str, probe: Probe) -> dict[str, Any]:
    """What the bundle decides for the probe's step, as `submit_step` would on a new step."""
    if not text:
        return render_result(PERMISSIVE)
    bundle = load_bundle(text)
    return render_result(bundle.evaluate(probe.agent_id, probe.kind, probe.target, probe.args_json))


def render_result(result: PolicyResult) -> dict[str, Any]:
    body: dict[str, Any] = {
        "action": result.action.value,
        "rule_id": result.rule_id,
        "reason": result.reason,
    }
    if result.approval is not None:
        approvers = result.approval.approvers
        body["approvers"] = list(approvers) if approvers is not None else None
        body["message"] = result.approval.message
    return body


def plain(value: object) -> Any:
    """A YAML value as JSON: mappings, lists and scalars as they are, anything else as text."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
