"""The signed webhook POST (§6): body-scheme signature, per-attempt timeout, any 2xx is ok.

Must not import the store, the service layer, or the API.
"""

from __future__ import annotations

import httpx

from rebuno.kernel.domain.dispatch import DeliveryOutcome
from rebuno.protocol.extensions import EXTENSIONS_HEADER, OFFERED
from rebuno.protocol.signing import EXECUTION_ID_HEADER, SIGNATURE_HEADER, sign_body

MAX_REDIRECTS = 10
# Tells an agent of ours which of this kernel's own protocol extensions it may use; other
# SDKs ignore the header.
EXTENSIONS = ", ".join(OFFERED)


class HttpDeliverer:
    """Delivers webhooks over one pooled HTTP client."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def deliver(
        self, url: str, secret: str, execution_id: str, body: bytes, timeout_seconds: float
    ) -> DeliveryOutcome:
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign_body(secret, body),
            EXECUTION_ID_HEADER: execution_id,
            EXTENSIONS_HEADER: EXTENSIONS,
        }
        try:
            response = await self._client.post(
                url, content=body, headers=headers, timeout=timeout_seconds
            )
        except httpx.HTTPError as exc:
            return DeliveryOutcome(False, f"{type(exc).__name__}: {exc}")
        if 200 <= response.status_code < 300:
            return DeliveryOutcome(True)
        return DeliveryOutcome(False, f"agent answered {response.status_code}")

    async def close(self) -> None:
        await self._client.aclose()
