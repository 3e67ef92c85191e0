"""This kernel's own protocol extensions, which only our SDK negotiates. Standard library only.

The kernel names the extensions it offers in the `Rebuno-Extensions` header of each webhook;
an agent uses one only when it was offered, so the official SDKs, which ignore the header,
talk the standard protocol unchanged.

- `step-completions`: a `safe_to_retry` step's outcome may be carried in a `completions` list
  (`[{"step_id", "result"} | {"step_id", "error"}]`) in the body of the agent's next step
  submission or execution complete/fail, and is recorded in that request's transaction
  instead of costing a request and a commit of its own.
"""

from __future__ import annotations

EXTENSIONS_HEADER = "Rebuno-Extensions"
STEP_COMPLETIONS = "step-completions"
OFFERED = (STEP_COMPLETIONS,)
