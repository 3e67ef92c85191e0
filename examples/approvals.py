"""List pending approvals, or decide the oldest one.

python examples/approvals.py              # list
python examples/approvals.py grant        # grant the oldest pending approval
python examples/approvals.py deny "why"   # deny it, with a rationale
"""

import asyncio
import os
import sys

from rebuno import Client


async def main(action: str, rationale: str) -> None:
    base_url = os.environ.get("REBUNO_URL", "http://127.0.0.1:8080")
    async with Client(base_url=base_url) as client:
        pending = await client.list_approvals(status="pending")
        for approval in pending:
            print(f"{approval.id}  execution {approval.execution_id}  {approval.message}")
        if not pending or action == "list":
            print(f"{len(pending)} pending")
            return
        oldest = pending[0]
        decide = client.grant_approval if action == "grant" else client.deny_approval
        await decide(oldest.id, decided_by=os.environ.get("USER", "operator"), rationale=rationale)
        print(f"{action} {oldest.id}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "list", " ".join(sys.argv[2:])))
