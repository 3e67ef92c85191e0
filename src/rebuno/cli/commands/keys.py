"""`rebuno key create|ls|rotate|revoke` (also spelt `keys`): scoped API keys (§34.6).

Each command prints one compact JSON document (none for `revoke`); a created or rotated key's
token is in it, and is shown nowhere else, ever. Must not import anything under
`rebuno.kernel`: it talks to a kernel over HTTP.
"""

from __future__ import annotations

import json
from typing import Any

import click

from rebuno.cli.admin import AdminClient
from rebuno.cli.aliases import Aliased
from rebuno.cli.remote import Remote, remote_command


def _print(value: Any) -> None:
    click.echo(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


@click.group("key", cls=Aliased)
def key() -> None:
    """Create, list, rotate and revoke scoped API keys (also: keys). Ids are full UUIDs."""


@key.command("create")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="SCOPE",
    help="A scope the key holds; repeat it or separate scopes with commas.",
)
@remote_command
def create(remote: Remote, name: str, scopes: tuple[str, ...]) -> None:
    """Issue a key named NAME; prints it with its token, which is never shown again."""
    wanted = [part.strip() for scope in scopes for part in scope.split(",") if part.strip()]

    async def issue(client: AdminClient, _out: object) -> None:
        _print(await client.create_api_key(name, wanted))

    remote.run(issue)


@key.command("ls")
@remote_command
def ls(remote: Remote) -> None:
    """List every key, revoked ones included, oldest first; never a token."""

    async def listing(client: AdminClient, _out: object) -> None:
        _print(await client.list_api_keys())

    remote.run(listing)


@key.command("rotate")
@click.argument("key_id", metavar="ID")
@remote_command
def rotate(remote: Remote, key_id: str) -> None:
    """Give key ID a new token (printed once); the old one stops working at once."""

    async def rotation(client: AdminClient, _out: object) -> None:
        _print(await client.rotate_api_key(key_id))

    remote.run(rotation)


@key.command("revoke")
@click.argument("key_id", metavar="ID")
@remote_command
def revoke(remote: Remote, key_id: str) -> None:
    """Revoke key ID for good; it stays listed, so what it did keeps a name."""

    async def revocation(client: AdminClient, _out: object) -> None:
        await client.revoke_api_key(key_id)

    remote.run(revocation)
