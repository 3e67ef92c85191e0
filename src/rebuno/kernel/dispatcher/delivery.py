"""The signed webhook POST (§6): body-scheme signature, per-attempt timeout, any 2xx is ok.

Deliveries go over `rebuno._http`'s keep-alive pools, one per agent origin: a delivery is on the
path of every execution, and a general-purpose client costs more than the rest of it. Redirects
are not followed (§6 allows either); a 3xx is a failed attempt like any other non-2xx.
Must not import the store, the service layer, or the API.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from rebuno._http import Pool, TransportError
from rebuno.kernel.domain.dispatch import DeliveryOutcome
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
    """Delivers webhooks over one keep-alive pool per agent origin."""

    def __init__(self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._timeout = timeout_seconds
        self._pools: dict[str, Pool] = {}

    async def deliver(
        self,
        url: str,
        secret: str,
        execution_id: str,
        body: bytes,
        timeout_seconds: float,
        *,
        extensions: tuple[str, ...] = (),
        carried: str | None = None,
    ) -> DeliveryOutcome:
        headers = [
            ("Content-Type", "application/json"),
            (SIGNATURE_HEADER, sign_body(secret, body)),
            (EXECUTION_ID_HEADER, execution_id),
        ]
        if extensions:
            # Tells an agent of ours which of this kernel's own protocol extensions it may use
            # on this delivery; other SDKs ignore the header.
            headers.append((EXTENSIONS_HEADER, ", ".join(extensions)))
        if carried is not None:
            headers.append((EXECUTION_HEADER, carried))
            headers.append((EXECUTION_SIGNATURE_HEADER, sign_carried(secret, body, carried)))
        try:
            pool, target = await self._pool_for(url, timeout_seconds)
            response = await pool.request("POST", target, headers, body)
        except (TransportError, ValueError) as exc:
            return DeliveryOutcome(False, f"{type(exc).__name__}: {exc}")
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
            pool = Pool(origin, timeout=timeout_seconds or self._timeout)
            self._pools[origin] = pool
        return pool, target

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
