"""A shell agent gated by approval: read-only commands run, anything else waits for a human.

The policy lives in examples/shell.yaml (agent `shell` of examples/rebuno.yaml), its test cases
in examples/shell.policytest.yaml.

    make dev                                  # terminal 1
    python examples/shell_agent.py            # terminal 2: this agent on port 5003
    python examples/client.py shell '{"command": "ls -la"}'              # runs at once
    python examples/client.py shell '{"command": "touch /tmp/approved"}' # blocks...
    python examples/approvals.py grant        # terminal 3: ...until someone grants it
"""

import asyncio
import os

from rebuno import Agent, tool


@tool(idempotency="at_most_once")
async def run_command(command: str) -> dict[str, object]:
    process = await asyncio.create_subprocess_shell(
        command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    return {"exit_code": process.returncode, "output": output.decode(errors="replace")[-4000:]}


async def process(command: str) -> object:
    result = await run_command(command)
    if isinstance(result, str):  # a denial comes back as the tool's answer
        return {"refused": result}
    return result


agent = Agent(
    "shell",
    secret=os.environ.get("REBUNO_AGENT_SECRET", "shell-dev-secret"),
    base_url=os.environ.get("REBUNO_URL", "http://127.0.0.1:8080"),
)

if __name__ == "__main__":
    agent.run(process, host="127.0.0.1", port=int(os.environ.get("PORT", "5003")))
