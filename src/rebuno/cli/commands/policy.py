"""`rebuno policy check|test|set`: validate a policy bundle, test it (its case file, one
probed step, or a recorded execution replayed by a kernel) and load it onto an agent.

Uses the kernel's own loader and engine (`rebuno.kernel.policy`), so what passes here is what
the kernel accepts and decides; rate limits and token budgets are stateful and only listed.
Imports nothing else of the kernel; `--execution` and `set` talk to a kernel over HTTP.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import click

from rebuno.cli.admin import AdminClient
from rebuno.cli.aliases import Aliased
from rebuno.cli.policytests import default_cases, print_report, run_case_file
from rebuno.cli.remote import DEFAULT_URL, Remote, remote_command
from rebuno.cli.render import Output
from rebuno.kernel.domain.errors import KernelError
from rebuno.kernel.policy import Bundle, PolicyResult, load_bundle
from rebuno.protocol.canonical import canonical_args
from rebuno.protocol.durations import format_duration
from rebuno.protocol.enums import PolicyAction, StepKind

BUNDLE = click.argument("bundle_file", metavar="FILE", type=click.Path(dir_okay=False))


@click.group("policy", cls=Aliased)
def policy() -> None:
    """Validate and test policy bundles (offline), and load them onto agents."""


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
    "--cases",
    "cases_file",
    default=None,
    metavar="FILE",
    help="The case file (default: FILE with its extension replaced by .policytest.yaml).",
)
@click.option("--agent-id", default="", help="The agent of cases that name none.")
@click.option("--target", default=None, help="Probe one step with this tool name or model id.")
@click.option("--args", "args_text", default=None, metavar="JSON", help="The probed step's args.")
@click.option(
    "--kind",
    default=None,
    type=click.Choice([kind.value for kind in StepKind]),
    help="The probed step's kind (default: tool_call).",
)
@click.option(
    "--execution",
    default=None,
    metavar="ID",
    help="Replay this recorded execution through FILE on the kernel (needs --agent-id).",
)
@click.option(
    "--url",
    envvar="REBUNO_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The kernel's URL, for --execution (env REBUNO_URL).",
)
@click.option(
    "--api-key",
    envvar="REBUNO_API_KEY",
    default="",
    help="Bearer token of a server-mode kernel, for --execution (env REBUNO_API_KEY).",
)
@click.option("--json", "json_output", is_flag=True, help="Print JSON instead of text.")
def test(
    bundle_file: str,
    cases_file: str | None,
    agent_id: str,
    target: str | None,
    args_text: str | None,
    kind: str | None,
    execution: str | None,
    url: str,
    api_key: str,
    json_output: bool,
) -> None:
    """Run FILE's test cases (offline), probe one step (--target), or replay a recorded
    execution through FILE (--execution). Exits 1 when a case misses its expectation."""
    args = _probe_args(args_text)
    _check_flags(target, args_text, kind, execution, cases_file, agent_id)
    text, bundle = _read(bundle_file)
    out = Output.to(json=json_output)
    if target is not None:
        _probe(out, bundle, agent_id, StepKind(kind or StepKind.TOOL_CALL), target, args)
    elif execution is not None:
        request = {"bundle": text, "execution_id": execution}
        remote = Remote(url, api_key, json_output)
        remote.run(lambda client, out: _replay(client, out, agent_id, request))
    else:
        cases = Path(cases_file) if cases_file else default_cases(bundle_file)
        report = run_case_file(bundle, text, cases, agent_id, given=cases_file is not None)
        print_report(out, report)


@policy.command("set")
@click.argument("agent_id", metavar="AGENT_ID")
@BUNDLE
@remote_command
def set_bundle(remote: Remote, agent_id: str, bundle_file: str) -> None:
    """Load FILE onto AGENT_ID, after checking it here: a bundle that does not compile is
    never sent."""
    text, _ = _read(bundle_file)
    size = len(text.encode("utf-8"))

    async def send(client: AdminClient, out: Output) -> None:
        await client.set_policy(agent_id, text)
        if out.json:
            out.json_value({"agent_id": agent_id, "bytes": size})
        else:
            out.line(f"  loaded {size} bytes onto {agent_id}")

    remote.run(send)


def _probe_args(args_text: str | None) -> str | None:
    if args_text is None:
        return None
    try:
        return canonical_args(args_text)
    except ValueError as exc:
        raise click.UsageError(f"--args is not valid JSON: {exc}") from None


def _check_flags(
    target: str | None,
    args_text: str | None,
    kind: str | None,
    execution: str | None,
    cases_file: str | None,
    agent_id: str,
) -> None:
    """§35.5's combinations; each wrong one is a usage error (exit 2)."""
    if target is None and (args_text is not None or kind is not None):
        raise click.UsageError("--args and --kind describe the step --target probes")
    if execution is None:
        if target is not None and cases_file is not None:
            raise click.UsageError("--target probes one step; it cannot run --cases")
        return
    if target is not None or cases_file is not None:
        raise click.UsageError("--execution cannot be combined with --target or --cases")
    if not agent_id:
        raise click.UsageError("--execution needs --agent-id, the agent that ran it")
    if not _is_uuid(execution):
        raise click.UsageError("--execution needs an execution's full id (a UUID)")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


async def _replay(client: AdminClient, out: Output, agent_id: str, request: dict[str, Any]) -> None:
    print_report(out, await client.test_policy(agent_id, request))


def _probe(
    out: Output, bundle: Bundle, agent_id: str, kind: StepKind, target: str, args: str | None
) -> None:
    result = bundle.evaluate(agent_id, kind, target, args)
    if out.json:
        out.json_value(_as_json(result))
    else:
        _describe(out, result)


def _read(path: str) -> tuple[str, Bundle]:
    """The bundle's text and its compiled rules (§35.5: always compiled here first)."""
    text = _text(path)
    try:
        return text, load_bundle(text)
    except KernelError as exc:
        raise click.ClickException(f"{path}: {exc.message}") from None


def _load(path: str) -> Bundle:
    return _read(path)[1]


def _text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read {path}: {_reason(exc)}") from None


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
