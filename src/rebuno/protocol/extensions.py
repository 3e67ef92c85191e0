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
- `step-occurrences`: offered with every delivery that is not offered `step-records`. The
  agent numbers its own submissions: each carries `occurrence`, how many earlier submissions
  of this delivery with the same kind, target and canonical args the kernel counted (§7.3:
  answered `proceed`, `replay` or `denied`, or blocked on an approval). Having sent it once,
  the agent sends it with every submission of the delivery. The kernel then needs no
  occurrence counter to find a recorded step, so it answers a succeeded or failed one (R1,
  R2) from one read, without a transaction. Such an answer does not renew the lease, so it is
  given only while the lease was renewed within a third of the shortest lease period; past
  that, the submission takes the ordinary way, which renews it.
"""

from __future__ import annotations

from collections.abc import Mapping

EXTENSIONS_HEADER = "Rebuno-Extensions"
STEP_COMPLETIONS = "step-completions"
STEP_RECORDS = "step-records"
STEP_OCCURRENCES = "step-occurrences"
OFFERED = (STEP_COMPLETIONS,)
"""Offered with every delivery; `step-records` or `step-occurrences` is added per delivery."""


def parse(value: str | None) -> frozenset[str]:
    """The extension names in a `Rebuno-Extensions` header value."""
    if not value:
        return frozenset()
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def asks_for(headers: Mapping[str, str], name: str) -> bool:
    """Whether a request's `Rebuno-Extensions` header names `name`."""
    return name in parse(headers.get(EXTENSIONS_HEADER))
