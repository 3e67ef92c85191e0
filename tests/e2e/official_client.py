"""Run with an official SDK's Python: its bearer `Client` against a `rebuno server`, with the
bootstrap token, a scoped key that may only read, and a token that is neither. Prints one
line per check for the test to compare."""

from __future__ import annotations

import asyncio
import sys

from rebuno import Client, ForbiddenError, UnauthorizedError


async def main(url: str, bootstrap: str, reader: str) -> None:
    async with Client(url, bootstrap) as admin:
        created = await admin.create("compat", {"topic": "x"})
        fetched = await admin.get(created.id)
        print("bootstrap", fetched.id == created.id, getattr(fetched, "created_by", "bootstrap"))
    async with Client(url, reader) as client:
        print("reader-get", (await client.get(created.id)).id == created.id)
        try:
            await client.create("compat", {})
            print("reader-create allowed")
        except ForbiddenError:
            print("reader-create forbidden")
    async with Client(url, bootstrap + "x") as stranger:
        try:
            await stranger.get(created.id)
            print("stranger allowed")
        except UnauthorizedError:
            print("stranger unauthorized")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
