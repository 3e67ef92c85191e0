"""The signed webhook POST (§6): body-scheme signature, per-attempt timeout, any 2xx is ok.

Deliveries go over `rebuno._http`'s keep-alive pools, one per agent origin: a delivery is on the
path of every execution, and a general-purpose client costs more than the rest of it. Redirects
are not followed (§6 allows either); a 3xx is a failed attempt like any other non-2xx.
Must not import the store, the service layer, or the API.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from rebuno._http import Pool, TransportError
from rebuno.kernel.domain.dispatch import DeliveryOutcome, Webhook
from rebuno.kernel.domain.webhook import Targets, literal_address
from rebuno.protocol.extensions import (
    AGENT_INSTANCE_HEADER,
    EXECUTION_HEADER,
    EXECUTION_SIGNATURE_HEADER,
    EXTENSIONS_HEADER,
    AgentInstance,
    parse_instance,
    sign_carried,
)
from rebuno.protocol.signing import EXECUTION_ID_HEADER, SIGNATURE_HEADER, sign_body

DEFAULT_TIMEOUT_SECONDS = 30.0
_INSTANCE_NAME = AGENT_INSTANCE_HEADER.lower().encode("ascii")
MAX_ORIGINS = 1024
"""Agent origins kept with open pools; past that the oldest pool is closed."""


class HttpDeliverer:
    """Delivers webhooks over one keep-alive pool per agent origin, to the addresses `targets`
    allows: each new connection resolves the host and checks the address it then connects to
    (so a name cannot be re-pointed between the check and the connection)."""

    def __init__(
        self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, targets: Targets | None = None
    ) -> None:
        self._timeout = timeout_seconds
        self._targets = targets or Targets(loopback=True)
        self._pools: dict[str, Pool] = {}

    async def deliver(self, webhook: Webhook) -> DeliveryOutcome:
        secret, body, carried = webhook.secret, webhook.body, webhook.carried
        headers = [
            ("Content-Type", "application/json"),
            (SIGNATURE_HEADER, sign_body(secret, body)),
            (EXECUTION_ID_HEADER, webhook.execution_id),
        ]
        if webhook.extensions:
            # Tells an agent of ours which of this kernel's own protocol extensions it may use
            # on this delivery; other SDKs ignore the header.
            headers.append((EXTENSIONS_HEADER, ", ".join(webhook.extensions)))
        if carried is not None:
            headers.append((EXECUTION_HEADER, carried))
            headers.append((EXECUTION_SIGNATURE_HEADER, sign_carried(secret, body, carried)))
        try:
            pool, target = await self._pool_for(webhook.url, webhook.timeout_seconds)
            response = await pool.request("POST", target, headers, body)
        except (TransportError, ValueError) as exc:
            return DeliveryOutcome(False, f"{type(exc).__name__}: {exc}", answered=False)
        if 200 <= response.status < 300:
            return DeliveryOutcome(True, instance=_instance(response.headers))
        return DeliveryOutcome(False, f"agent answered {response.status}")

    async def _pool_for(self, url: str, timeout_seconds: float) -> tuple[Pool, str]:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        pool = self._pools.get(origin)
        if pool is None:
            if len(self._pools) >= MAX_ORIGINS:
                await self._pools.pop(next(iter(self._pools))).aclose()
            pool = Pool(origin, timeout=timeout_seconds or self._timeout, resolve=self._resolve)
            self._pools[origin] = pool
        return pool, target

    async def _resolve(self, host: str, port: int) -> str:
        """The first address `host` resolves to, when webhooks may reach it."""
        address = literal_address(host)
        if address is None:
            loop = asyncio.get_running_loop()
            try:
                found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise TransportError(f"cannot resolve {host}: {exc}") from exc
            if not found:
                raise TransportError(f"cannot resolve {host}")
            address = ipaddress.ip_address(found[0][4][0])
        if self._targets.refuses(address):
            raise TransportError(
                f"{host} is {address}, a loopback, link-local or private address that"
                " REBUNO_WEBHOOK_ALLOW does not name"
            )
        return str(address)

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


def _instance(headers: list[tuple[bytes, bytes]]) -> AgentInstance | None:
    """The instance an acknowledgement names; none when the header is absent, repeated or
    malformed (`agent-instances`: a bad value is ignored, the acknowledgement still counts)."""
    values = [value for name, value in headers if name == _INSTANCE_NAME]
    if len(values) != 1:
        return None
    return parse_instance(values[0].decode("latin-1"))
