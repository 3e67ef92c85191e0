"""`rebuno policy check|test`: validate a policy bundle and try it on a step, offline.

Uses the kernel's own loader and engine (`rebuno.kernel.policy`), so what passes here is what
the kernel accepts and decides; rate limits and token budgets are stateful and only listed.
Imports nothing else of the kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rebuno.cli.aliases import Aliased
from rebuno.cli.render import Output
from rebuno.kernel.domain.errors import KernelError
from rebuno.kernel.policy import Bundle, PolicyResult, load_bundle
from rebuno.protocol.canonical import canonical_args
from rebuno.protocol.durations import format_duration
from rebuno.protocol.enums import PolicyAction, StepKind

BUNDLE = click.argument("bundle_file", metavar="FILE", type=click.Path(dir_okay=False))


@click.group("policy", cls=Aliased)
def policy() -> None:
    """Validate policy bundles and see what they decide, without a kernel."""


@policy.command("check")
@BUNDLE
def check(bundle_file: str) -> None:
    """Validate FILE: exit 0 with `ok: N rules`, or 1 naming the rule and field at fault."""
    bundle = _load(bundle_file)
    count = len(bundle.rules)
    default = bundle.default_action.value
    click.echo(f"ok: {count} rule{'' if count == 1 else 's'} (default: {default})")


@policy.command("test")
@BUNDLE
@click.option(
    "--kind",
    default=StepKind.TOOL_CALL.value,
    show_default=True,
    type=click.Choice([kind.value for kind in StepKind]),
)
@click.option("--target", default="", help="The tool name or model id.")
@click.option("--args", "args_text", default="null", metavar="JSON", help="The step's arguments.")
@click.option("--agent-id", default="", help="The agent, for rules with an `agent` condition.")
@click.option("--json", "json_output", is_flag=True, help="Print JSON instead of text.")
def test(
    bundle_file: str, kind: str, target: str, args_text: str, agent_id: str, json_output: bool
) -> None:
    """Print the decision FILE gives a new step: decision, rule id and reason."""
    bundle = _load(bundle_file)
    try:
        args = canonical_args(args_text)
    except ValueError as exc:
        raise click.UsageError(f"--args is not valid JSON: {exc}") from None
    result = bundle.evaluate(agent_id, StepKind(kind), target, args)
    out = Output.to(json=json_output)
    if out.json:
        out.json_value(_as_json(result))
    else:
        _describe(out, result)


def _load(path: str) -> Bundle:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read {path}: {_reason(exc)}") from None
    try:
        return load_bundle(text)
    except KernelError as exc:
        raise click.ClickException(f"{path}: {exc.message}") from None


def _reason(exc: OSError | UnicodeDecodeError) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _as_json(result: PolicyResult) -> dict[str, Any]:
    limits = _limits(result)
    return {
        "decision": result.action.value,
        "rule_id": result.rule_id,
        "reason": result.reason,
        **({"limits": limits} if limits else {}),
    }


def _describe(out: Output, result: PolicyResult) -> None:
    style = {"allow": "green", "deny": "red"}.get(result.action.value, "magenta")
    out.field("decision", out.style(result.action.value, style))
    out.field("rule", result.rule_id)
    # What the agent would see: a denial without a reason of its own reads `policy_denied`.
    denied = result.action is PolicyAction.DENY
    out.field("reason", result.reason or ("policy_denied" if denied else "-"))
    for name, text in _limits(result).items():
        out.field(name, text)


def _limits(result: PolicyResult) -> dict[str, str]:
    limits: dict[str, str] = {}
    if result.approval is not None:
        approvers = ", ".join(result.approval.approvers or ()) or "anyone"
        timeout = result.approval.timeout
        after = f", times out after {format_duration(timeout)}" if timeout else ""
        message = f" ({result.approval.message})" if result.approval.message else ""
        limits["approval"] = f"by {approvers}{after}{message}"
    if result.rate_limit is not None:
        limit = result.rate_limit
        wait = (
            f", parks up to {format_duration(limit.max_wait)}"
            if limit.max_wait
            else ", refuses when spent"
        )
        window = format_duration(limit.window)
        limits["rate limit"] = (
            f"{limit.max_calls} per {window} per {limit.per_what}{wait} (not applied here)"
        )
    if result.budget is not None:
        budget = result.budget
        limits["token budget"] = (
            f"{budget.max_tokens} tokens, then {budget.on_exceed.value} (not applied here)"
        )
    return limits
