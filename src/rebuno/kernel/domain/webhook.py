"""Which webhook URLs an agent may register and which addresses the kernel may POST to (§6).

A registered URL is the kernel's own outgoing request, signed, to wherever it points: left
unchecked, registering an agent would let anyone with the bearer token make the kernel probe
the metadata service at 169.254.169.254 or a database port on loopback. So a URL must be
`http` or `https` with a host and nothing a request line cannot carry, and the address it
reaches (checked here for an IP literal in any spelling the C library accepts, and again at
connect time once a name is resolved) must not be loopback, link-local, private or otherwise
special unless the operator's allow list names its network. `rebuno dev` also allows
loopback, where a developer's agents run.

Must not import anything outside `rebuno.protocol` and the domain (`ipaddress` and `socket`'s
address parsing only: no I/O).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_WEBHOOK_URL = 2048
_SCHEMES = frozenset({"http", "https"})

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a webhook URL, or None."""
    if len(url) > MAX_WEBHOOK_URL:
        return f"webhook_url is longer than {MAX_WEBHOOK_URL} characters"
    if not url.isprintable() or any(c.isspace() for c in url):
        return "webhook_url must not contain white space or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a malformed port raises only when read
    except ValueError as exc:
        return f"webhook_url is not a URL: {exc}"
    if parts.scheme.lower() not in _SCHEMES:
        return "webhook_url must be an http:// or https:// URL"
    if not parts.hostname:
        return "webhook_url must name a host"
    if parts.fragment:
        return "webhook_url must not carry a fragment"
    return None


def literal_address(host: str) -> Address | None:
    """The address `host` spells, in any form the C library's resolver would take as one
    (`127.1`, `0x7f000001` and `2130706433` are 127.0.0.1), or None for a name."""
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def parse_networks(text: str) -> tuple[Network, ...]:
    """`REBUNO_WEBHOOK_ALLOW`: comma-separated CIDR ranges. Raises `ValueError` naming a bad
    one."""
    networks: list[Network] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a CIDR range such as 127.0.0.0/8") from None
    return tuple(networks)


@dataclass(frozen=True, slots=True)
class Targets:
    """The addresses webhooks may reach: public ones, the `allow` networks, and loopback when
    `loopback` (dev)."""

    allow: Sequence[Network] = ()
    loopback: bool = False

    def refuses(self, address: Address) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address.version == net.version and address in net for net in self.allow):
            return False
        if address.is_loopback:
            return not self.loopback
        return not address.is_global or address.is_multicast

    def problem(self, url: str) -> str | None:
        """Why the kernel may not deliver to `url` as registered, or None. A name is judged
        once resolved, at connect time."""
        if (problem := url_problem(url)) is not None:
            return problem
        host = urlsplit(url).hostname or ""
        address = literal_address(host)
        if address is not None and self.refuses(address):
            return (
                f"webhook_url points at {address}, a loopback, link-local or private address:"
                " name its network in REBUNO_WEBHOOK_ALLOW to allow it"
            )
        return None
