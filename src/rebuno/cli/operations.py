"""The operations the one-shot commands and the REPL share: each takes an `AdminClient` and an
`Output`, talks to the kernel over HTTP, and prints text (or JSON when asked).

Ids may be full or a unique prefix (see `AdminClient.resolve_execution_id`). Imports the SDK
and the CLI's own modules; nothing of the kernel.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import Any

from rebuno.cli.admin import AdminClient, AgentInfo, InputError
from rebuno.cli.render import Output, age, one_line
from rebuno.protocol.events import LEASE_EXPIRED, EventType
from rebuno.sdk.errors import APIError, NetworkError, RebunoError
from rebuno.types import Event, Execution

WATCH_INTERVAL = 0.3
"""Seconds between two polls of `exec watch` and of the end of `exec stream`."""
SHORT_ID = 18
"""Characters of a short UUID (`01a05eb7-e102-78e9`): a UUIDv7's first 8 hex digits advance
only about every 65 s, so shorter prefixes of ids made together would all look alike."""
EVENTS_PAGE = 1000
_TERMINAL_EVENTS = frozenset(
    {EventType.EXECUTION_COMPLETED, EventType.EXECUTION_FAILED, EventType.EXECUTION_CANCELLED}
)
_DELIVERY_EVENTS = frozenset({EventType.DISPATCH_ACKED, EventType.DISPATCH_FAILED})
DISPATCH_EXHAUSTED = "dispatch_exhausted"
"""The failure reason of an execution whose delivery attempts ran out (§12.6)."""
_APPROVAL_RESOLVED = frozenset(
    {EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED, EventType.APPROVAL_EXPIRED}
)
_EVENT_STYLE = {
    "completed": "green",
    "succeeded": "green",
    "acked": "green",
    "granted": "green",
    "allowed": "green",
    "failed": "red",
    "denied": "red",
    "cancelled": "yellow",
    "expired": "yellow",
    "discarded": "yellow",
    "rate_limited": "yellow",
    "blocked": "magenta",
    "awaiting_approval": "magenta",
    "requested": "magenta",
}


def short_ids(ids: Sequence[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """Each id's shortest prefix (at least `minimum` characters) no other id shares.

    UUIDv7 ids start with their creation time, so ids made together share a long prefix; past
    `minimum`, the prefix grows just enough to tell them apart.
    """
    ordered = sorted(set(ids))
    shortest: dict[str, str] = {}
    for index, identifier in enumerate(ordered):
        neighbours = ordered[max(index - 1, 0) : index] + ordered[index + 1 : index + 2]
        common = max((_common_length(identifier, other) for other in neighbours), default=0)
        shortest[identifier] = identifier[: max(minimum, common + 1)]
    return shortest


def _common_length(first: str, second: str) -> int:
    length = 0
    for left, right in zip(first, second, strict=False):
        if left != right:
            break
        length += 1
    return length


def error_message(exc: RebunoError | InputError, url: str = "") -> str:
    """The text after `error: ` for a failed operation against the kernel at `url`: one line
    that names the URL and what went wrong."""
    where = f" at {url}" if url else ""
    if isinstance(exc, APIError):
        if exc.code == "internal_error" and exc.status_code != 500:
            # A body that is no error envelope of ours: something else answers there.
            return (
                f"the server{where} answered {exc.status_code} without a Rebuno error"
                " envelope: is --url the kernel's?"
            )
        return f"{exc.message} ({exc.code})"
    if isinstance(exc, NetworkError):
        cause = exc.__cause__
        if isinstance(cause, ValueError):
            return f"--url: {cause}"
        reason = str(cause) if cause is not None else "no answer"
        return f"cannot reach the kernel{where}: {reason}"
    return str(exc)


def dump(model: Any) -> Any:
    return model.model_dump(mode="json")


# -- executions ----------------------------------------------------------------------------


async def list_executions(
    client: AdminClient,
    out: Output,
    *,
    agent_id: str = "",
    status: str = "",
    session: str = "",
    limit: int = 50,
) -> None:
    page = await client.list(agent_id=agent_id, status=status, session=session, limit=limit)
    if out.json:
        out.json_value([dump(execution) for execution in page.executions])
        return
    shown = short_ids([execution.id for execution in page.executions])
    rows = [
        [shown[e.id], e.agent_id, out.status(e.status), age(e.created_at)] for e in page.executions
    ]
    out.table(["ID", "AGENT", "STATUS", "AGE"], rows, empty="no executions")


async def create_execution(
    client: AdminClient,
    out: Output,
    agent_id: str,
    input: Any,
    *,
    session: str = "",
    parent: str = "",
    idempotency_key: str = "",
    on_behalf_of: str = "",
) -> None:
    execution = await client.create(
        agent_id,
        input,
        session=session,
        parent_execution_id=parent,
        idempotency_key=idempotency_key,
        on_behalf_of=on_behalf_of,
    )
    if out.json:
        out.json_value(dump(execution))
        return
    short = execution.id[:SHORT_ID]
    status = out.status(execution.status)
    out.line(f"created {short} ({status}); follow with 'rebuno exec watch {short}'")
    if execution.session and not execution.admitted_at:
        out.line(f"waiting in session {execution.session} for its earlier turns to end")


async def fork_execution(
    client: AdminClient, out: Output, ident: str, at_seq: int, session: str, policy: str
) -> None:
    source = await client.resolve_execution_id(ident)
    fork = await client.fork(source, at_seq=at_seq, session=session, policy_bundle=policy)
    if out.json:
        out.json_value(dump(fork))
        return
    short = fork.id[:SHORT_ID]
    out.line(
        f"forked {short} from {source[:SHORT_ID]} at {at_seq};"
        f" follow with 'rebuno exec watch {short}'"
    )


async def show_execution(client: AdminClient, out: Output, ident: str) -> None:
    execution = await client.get(await client.resolve_execution_id(ident))
    if out.json:
        out.json_value(dump(execution))
        return
    describe_execution(out, execution)
    if execution.failure_reason == DISPATCH_EXHAUSTED:
        last = await _last_delivery(client, execution.id)
        if last is not None:
            out.field("last delivery", _dispatch_summary(last))


async def _last_delivery(client: AdminClient, execution_id: str) -> dict[str, Any] | None:
    """The payload of the execution's last `dispatch.acked` or `dispatch.failed`: what became
    of the last delivery before its attempts ran out."""
    last: dict[str, Any] | None = None
    after_seq = 0
    while page := await client.events(execution_id, after_seq=after_seq, limit=EVENTS_PAGE):
        for event in page:
            if event.type in _DELIVERY_EVENTS and isinstance(event.payload, dict):
                last = event.payload
        after_seq = page[-1].event_seq
    return last


def describe_execution(out: Output, execution: Execution) -> None:
    out.field("id", execution.id)
    out.field("agent", execution.agent_id)
    out.field("status", out.status(execution.status))
    if execution.status == "completed":
        out.field("output", one_line(execution.output))
    if execution.failure_reason:
        out.field("failure", out.style(execution.failure_reason, "red"))
    out.field("created", f"{execution.created_at} ({age(execution.created_at)} ago)")
    lineage = (
        ("session", execution.session),
        ("parent", execution.parent_execution_id),
        (
            "forked from",
            execution.forked_from and f"{execution.forked_from} at {execution.fork_seq}",
        ),
        (
            "spawned by",
            execution.spawned_by
            and f"{execution.spawned_by.execution_id}/{execution.spawned_by.step_id}",
        ),
        ("created by", execution.created_by),
        ("on behalf of", execution.on_behalf_of),
    )
    for name, value in lineage:
        if value:
            out.field(name, value)


async def watch_execution(
    client: AdminClient, out: Output, ident: str, *, interval: float = WATCH_INTERVAL
) -> Execution:
    """Prints events as they are appended until the execution is terminal, then its state."""
    execution_id = await client.resolve_execution_id(ident)
    after_seq = 0
    gates = Gates()
    while True:
        events = await client.events(execution_id, after_seq=after_seq, limit=EVENTS_PAGE)
        for event in events:
            _print_event(out, event)
            gates.follow(event)
        if not out.json:
            for approval_id, target in gates.new_pending():
                _print_gate(out, approval_id, target)
        if events:
            after_seq = events[-1].event_seq
        # A terminal event is written with the rest of its transaction, so its batch is whole.
        if any(event.type in _TERMINAL_EVENTS for event in events):
            break
        if len(events) < EVENTS_PAGE:
            await asyncio.sleep(interval)
    execution = await client.get(execution_id)
    if not out.json:
        describe_execution(out, execution)
    return execution


class Gates:
    """The approvals a log has requested and not yet resolved, each named once while pending.

    Read from the events alone: `approval.requested` opens one, `approval.granted`, `denied`
    or `expired` closes it, and the step's events give its target.
    """

    def __init__(self) -> None:
        self._targets: dict[str, str] = {}
        self._pending: dict[str, str] = {}
        self._named: set[str] = set()

    def follow(self, event: Event) -> None:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if event.type.startswith("step.") and payload.get("target"):
            self._targets[str(payload.get("step_id"))] = str(payload["target"])
        approval_id = str(payload.get("approval_id", ""))
        if event.type == EventType.APPROVAL_REQUESTED:
            self._pending[approval_id] = self._targets.get(str(payload.get("step_id")), "")
        elif event.type in _APPROVAL_RESOLVED:
            self._pending.pop(approval_id, None)

    def new_pending(self) -> list[tuple[str, str]]:
        """(approval id, target) of the pending approvals not named before."""
        fresh = [(key, target) for key, target in self._pending.items() if key not in self._named]
        self._named.update(key for key, _ in fresh)
        return fresh


def _print_gate(out: Output, approval_id: str, target: str) -> None:
    what = f" for {target}" if target else ""
    out.line(
        out.style(f"      waiting on approval {approval_id}{what}:", "magenta")
        + f" approvals get {approval_id}, then grant or deny it"
    )


async def show_events(client: AdminClient, out: Output, ident: str) -> None:
    """The whole log, each event with its payload indented below it."""
    execution_id = await client.resolve_execution_id(ident)
    events: list[Event] = []
    while page := await client.events(
        execution_id, after_seq=events[-1].event_seq if events else 0, limit=EVENTS_PAGE
    ):
        events.extend(page)
    if out.json:
        out.json_value([dump(event) for event in events])
        return
    for event in events:
        _print_event(out, event, details=False)
        payload = json.dumps(event.payload, indent=2, ensure_ascii=False)
        for text in payload.splitlines():
            out.line("      " + out.style(text, "dim"))


def _print_event(out: Output, event: Event, *, details: bool = True) -> None:
    if out.json:
        out.json_line(dump(event))
        return
    kind = event.type.rpartition(".")[2]
    name = out.style(f"{event.type:<24}", _EVENT_STYLE.get(kind, ""))
    clock = event.occurred_at[11:19]
    summary = _event_summary(event.payload) if details else ""
    out.line(f"{event.event_seq:>4}  {clock}  {name}  {summary}".rstrip())


_REDELIVERIES = {LEASE_EXPIRED: "redelivered: the previous attempt's lease expired"}


def _event_summary(payload: Any) -> str:
    if not isinstance(payload, dict):
        return ""
    if "dispatch_id" in payload:
        return _dispatch_summary(payload)
    parts = [str(payload[key]) for key in ("target", "reason", "decided_by") if payload.get(key)]
    if payload.get("rule_id"):
        parts.append(f"rule={payload['rule_id']}")
    if "attempt" in payload:
        parts.append(f"attempt={payload['attempt']}")
    if "output" in payload:
        parts.append(one_line(payload["output"], 80))
    return "  ".join(parts)


def _dispatch_summary(payload: dict[str, Any]) -> str:
    """`attempt=N`, then why the delivery failed, then why it was a redelivery."""
    parts = [f"attempt={payload.get('attempt')}"]
    if payload.get("reason"):
        parts.append(one_line(payload["reason"], 200))
    if redelivery := payload.get("redelivery"):
        parts.append(_REDELIVERIES.get(str(redelivery), f"redelivery={one_line(redelivery, 40)}"))
    return "  ".join(parts)


async def cancel_execution(client: AdminClient, out: Output, ident: str) -> None:
    execution_id = await client.resolve_execution_id(ident)
    await client.cancel(execution_id)
    if out.json:
        out.json_value({"id": execution_id, "cancelled": True})
        return
    out.line(f"cancelled {execution_id}")


async def stream_execution(
    client: AdminClient, out: Output, ident: str, *, interval: float = WATCH_INTERVAL
) -> None:
    """Prints live output deltas until the execution is terminal (or the user stops it)."""
    execution_id = await client.resolve_execution_id(ident)
    await _first(
        _print_deltas(client, out, execution_id),
        _until_terminal(client, execution_id, interval),
    )
    if not out.json:
        out.line()


async def _print_deltas(client: AdminClient, out: Output, execution_id: str) -> None:
    async for delta in client.stream(execution_id):
        if out.json:
            out.json_line(dump(delta))
        else:
            out.stream.write(delta.data)
            out.stream.flush()


async def _until_terminal(client: AdminClient, execution_id: str, interval: float) -> None:
    # Polled: the kernel pushes deltas, not status changes, to a client.
    while True:
        if (await client.get(execution_id)).status.is_terminal:
            return
        await asyncio.sleep(interval)


async def _first(*jobs: Awaitable[None]) -> None:
    """Runs the jobs until one ends; the others are cancelled, and its error is raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()


# -- agents --------------------------------------------------------------------------------


async def list_agents(client: AdminClient, out: Output) -> None:
    agents = await client.list_agents()
    if out.json:
        out.json_value([dump(agent) for agent in agents])
        return
    rows = [[agent.id, agent.webhook_url, _policy_size(agent)] for agent in agents]
    out.table(["ID", "WEBHOOK", "POLICY"], rows, empty="no agents")


def _policy_size(agent: AgentInfo) -> str:
    bundle = agent.policy_bundle
    return f"{len(bundle.encode('utf-8'))} bytes" if bundle else "none"


async def show_agent(client: AdminClient, out: Output, agent_id: str) -> None:
    agent = await client.get_agent(agent_id)
    if out.json:
        out.json_value(dump(agent))
        return
    out.field("id", agent.id)
    out.field("webhook", agent.webhook_url)
    out.field("registered", f"{agent.registered_at} ({age(agent.registered_at)} ago)")
    if agent.lease_timeout_seconds is not None:
        out.field("lease timeout", f"{agent.lease_timeout_seconds:g}s")
    _show_metadata(out, agent)
    if not agent.policy_bundle:
        out.field("policy", out.style("none (permissive)", "dim"))
        return
    out.field("policy", "")
    for text in agent.policy_bundle.rstrip("\n").splitlines():
        out.line("  " + text)


def _show_metadata(out: Output, agent: AgentInfo) -> None:
    """What the agent published about itself (§36), each schema as indented JSON."""
    if agent.description and "\n" not in agent.description:
        out.field("description", agent.description)
    elif agent.description:
        _indented(out, "description", agent.description)
    for label, schema in (
        ("input schema", agent.input_schema),
        ("output schema", agent.output_schema),
    ):
        if schema is not None:
            _indented(out, label, json.dumps(schema, indent=2, ensure_ascii=False))


def _indented(out: Output, label: str, text: str) -> None:
    out.field(label, "")
    for line in text.splitlines():
        out.line("  " + line)


async def add_agents(client: AdminClient, out: Output, manifest_path: str) -> None:
    agents = await client.register_manifest(manifest_path)
    if out.json:
        out.json_value([dump(agent) for agent in agents])
        return
    for agent in agents:
        out.line(f"registered {agent.id} ({agent.webhook_url}, policy {_policy_size(agent)})")
    if not agents:
        out.line(out.style(f"{manifest_path} lists no agents", "dim"))


async def remove_agent(client: AdminClient, out: Output, agent_id: str) -> None:
    await client.delete_agent(agent_id)
    if out.json:
        out.json_value({"id": agent_id, "deleted": True})
        return
    out.line(f"removed {agent_id}")
