"""Create an execution and print its events as they happen, until it ends.

python examples/client.py hello '{"name": "Ada"}'
python examples/client.py shell '{"command": "touch /tmp/rebuno-was-here"}'
"""

import asyncio
import json
import os
import sys

from rebuno import Client

TERMINAL = {"execution.completed", "execution.failed", "execution.cancelled"}


async def main(agent_id: str, payload: object) -> None:
    base_url = os.environ.get("REBUNO_URL", "http://127.0.0.1:8080")
    async with Client(base_url=base_url) as client:
        execution = await client.create(agent_id, input=payload)
        print(f"created execution {execution.id}")
        after_seq, finished = 0, False
        while not finished:
            events = await client.events(execution.id, after_seq=after_seq)
            for event in events:
                print(f"{event.event_seq:>3} {event.type:<24} {json.dumps(event.payload)}")
                finished = finished or event.type in TERMINAL
            after_seq = events[-1].event_seq if events else after_seq
            if not events:
                await asyncio.sleep(0.2)
        final = await client.get(execution.id)
        print(f"status: {final.status}  output: {json.dumps(final.output)}", end="")
        print(f"  failure: {final.failure_reason}" if final.failure_reason else "")


if __name__ == "__main__":
    agent = sys.argv[1] if len(sys.argv) > 1 else "hello"
    payload = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"name": "Ada"}
    asyncio.run(main(agent, payload))
