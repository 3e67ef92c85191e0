"""This kernel's own protocol extensions, which only our SDK negotiates. Standard library only.

The kernel names the extensions it offers in the `Rebuno-Extensions` header of each webhook;
an agent uses one only when it was offered, so the official SDKs, which ignore the header,
talk the standard protocol unchanged.

- `step-completions`: a `safe_to_retry` step's outcome may be carried in a `completions` list
  (`[{"step_id", "result"} | {"step_id", "error"}]`) in the body of the agent's next step
  submission or execution complete/fail, and is recorded in that request's transaction
  instead of costing a request and a commit of its own.
- `step-records`: offered only for an execution's first delivery, when its agent has no
  policy. The agent may then run a `safe_to_retry` tool or local step without submitting it
  first, and report it afterwards as a `completions` item with `kind`, `target`, `args` and
  `result` or `error`; a heartbeat may carry `completions` too. The agent asks again on each
  submission and heartbeat by sending the header; the kernel's answer carries the header back
  while the agent still has no policy, and the agent stops when it does not.
- `step-occurrences`: offered with every delivery; an agent that uses `step-records` on a
  delivery does not use it there (the kernel counts what is reported). The agent numbers its
  own submissions: each carries `occurrence`, how many earlier submissions
  of this delivery with the same kind, target and canonical args the kernel counted (§7.3:
  answered `proceed`, `replay` or `denied`, or blocked on an approval). Having sent it once,
  the agent sends it with every submission of the delivery. The kernel then needs no
  occurrence counter to find a recorded step, so it answers a succeeded or failed one (R1,
  R2) from one read, without a transaction. Such an answer does not renew the lease, so it is
  given only while the lease was renewed within a third of the shortest lease period; past
  that, the submission takes the ordinary way, which renews it.
- `execution-input`: offered with a delivery whose execution's input is at most
  `MAX_CARRIED_INPUT` bytes of JSON. The webhook then also carries the execution's status and
  input in `Rebuno-Execution` (`carried`), signed with the agent's secret over the webhook body
  and that value in `Rebuno-Execution-Signature`, so the agent need not read the execution
  before it runs the handler. The body stays the four fields §6 names.
- `agent-instances`: offered with every delivery. The agent names itself in its
  acknowledgement (`Rebuno-Agent-Instance: <name>; incarnation=<uuid>`, `format_instance`):
  the name of its process slot, stable across restarts, and a fresh id per start. After a
  restart it announces the new incarnation (`POST /v0/agents/{id}/instances`), and the kernel
  at once reclaims the deliveries an earlier incarnation of that name held, instead of
  waiting for their leases to expire.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from rebuno.protocol import signing
from rebuno.protocol.enums import ExecutionStatus

EXTENSIONS_HEADER = "Rebuno-Extensions"
STEP_COMPLETIONS = "step-completions"
STEP_RECORDS = "step-records"
STEP_OCCURRENCES = "step-occurrences"
EXECUTION_INPUT = "execution-input"
EXECUTION_HEADER = "Rebuno-Execution"
EXECUTION_SIGNATURE_HEADER = "Rebuno-Execution-Signature"
AGENT_INSTANCES = "agent-instances"
AGENT_INSTANCE_HEADER = "Rebuno-Agent-Instance"
MAX_INSTANCE_NAME = 200
"""Characters an instance name may have at most (`_NAME` says so too)."""
_LIVE = frozenset(status.value for status in ExecutionStatus if not status.is_terminal)
MAX_CARRIED_INPUT = 2048
"""Bytes of input JSON a webhook carries at most (4 KiB of header once encoded, with room)."""
OFFERED = (STEP_COMPLETIONS, AGENT_INSTANCES)
"""Offered with every delivery; `step-records` or `step-occurrences` is added per delivery."""


def parse(value: str | None) -> frozenset[str]:
    """The extension names in a `Rebuno-Extensions` header value."""
    if not value:
        return frozenset()
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def asks_for(headers: Mapping[str, str], name: str) -> bool:
    """Whether a request's `Rebuno-Extensions` header names `name`."""
    return name in parse(headers.get(EXTENSIONS_HEADER))


def carried(status: str, input_json: str) -> str:
    """The `Rebuno-Execution` value: `{"status", "input"}` as JSON, base64url without padding
    (a header holds ASCII only). `input_json` is JSON text already."""
    text = f'{{"status":{json.dumps(status)},"input":{input_json}}}'
    return base64.urlsafe_b64encode(text.encode("utf-8")).rstrip(b"=").decode("ascii")


def sign_carried(secret: str, body: bytes, value: str) -> str:
    """The `Rebuno-Execution-Signature` value: the body scheme over the webhook body, a
    newline and the `Rebuno-Execution` value, so neither can be swapped for another's."""
    return signing.sign_body(secret, _carried_message(body, value))


def read_carried(
    secret: str, body: bytes, value: str | None, signature: str | None
) -> tuple[str, Any] | None:
    """The status and the decoded input a webhook carries, or None when it carries none, or
    the signature does not match (constant-time), or the value does not decode to a live
    status and an input."""
    if not value or not signature or not value.isascii():
        return None
    if not signing.verify_body(secret, _carried_message(body, value), signature):
        return None
    try:
        decoded = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except ValueError:
        return None
    if (
        not isinstance(decoded, dict)
        or decoded.get("status") not in _LIVE
        or "input" not in decoded
    ):
        return None
    return decoded["status"], decoded["input"]


def _carried_message(body: bytes, value: str) -> bytes:
    return body + b"\n" + value.encode("ascii")


# Visible ASCII without the header's own separators, quotes and backslash: a name goes into a
# header as it is, and a host name with its port (`worker-3:5000`) fits.
_NAME = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]{1,200}")
_INCARNATION = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_INCARNATION_PARAMETER = "incarnation="


@dataclass(frozen=True, slots=True)
class AgentInstance:
    """An agent process: `name`, the same for every start of one process slot, and
    `incarnation`, a fresh UUID per start (lower-case, hyphenated)."""

    name: str
    incarnation: str


def is_instance_name(value: object) -> TypeGuard[str]:
    """Whether `value` may name an instance: 1 to 200 visible ASCII characters other than
    `"`, `,`, `;` and `\\`."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def is_incarnation(value: object) -> TypeGuard[str]:
    """Whether `value` is a UUID in its lower-case hyphenated form."""
    return isinstance(value, str) and _INCARNATION.fullmatch(value) is not None


def instance(name: object, incarnation: object) -> AgentInstance | None:
    """The instance, or None when either part is not valid."""
    if is_instance_name(name) and is_incarnation(incarnation):
        return AgentInstance(name, incarnation)
    return None


def format_instance(agent: AgentInstance) -> str:
    """The `Rebuno-Agent-Instance` value: `<name>; incarnation=<uuid>`."""
    return f"{agent.name}; {_INCARNATION_PARAMETER}{agent.incarnation}"


def parse_instance(value: str | None) -> AgentInstance | None:
    """The instance a `Rebuno-Agent-Instance` value names, or None when it is absent or not
    exactly `<name>; incarnation=<uuid>` with a valid name and UUID."""
    if not value or len(value) > MAX_INSTANCE_NAME + 64:
        return None
    name, separator, parameter = value.partition(";")
    parameter = parameter.strip()
    if not separator or not parameter.startswith(_INCARNATION_PARAMETER):
        return None
    return instance(name.strip(), parameter[len(_INCARNATION_PARAMETER) :])
