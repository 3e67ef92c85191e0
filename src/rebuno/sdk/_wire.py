"""What the SDK's two kernel clients (the agent's signed one and `Client`) share on top of the
lean pool of `rebuno._http`: opening it with the SDK's TLS trust, one path segment escaped, and
one request sent with the failures turned into the SDK's exceptions.
Imports only `rebuno._http`, the SDK's errors and httpx (for its TLS trust settings).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

import httpx

from rebuno._http import Pool, Response, TransportError
from rebuno.sdk.errors import NetworkError, error_from_envelope

JSON = ("Content-Type", "application/json")


def open_pool(base_url: str, timeout: float) -> Pool:
    """A pool to `base_url`; for https with the CA bundle and `SSL_CERT_FILE`/`SSL_CERT_DIR`
    handling of httpx. Raises ValueError for a URL no connection can be made to."""
    https = base_url.lower().startswith("https:")
    trust = httpx.create_ssl_context() if https else None
    return Pool(base_url, timeout=timeout, ssl_context=trust)


def segment(value: str) -> str:
    """`value` escaped as one path segment (kernel ids are already plain)."""
    return quote(value, safe="")


async def send(
    pool: Pool,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    path: str,
) -> Response:
    """One request; `NetworkError` when no answer came, the envelope's error for a status of
    300 or more. `path` names the request in messages."""
    try:
        response = await pool.request(method, target, headers, body)
    except TransportError as exc:
        raise NetworkError(f"{method} {path}: {exc!r}") from exc
    if response.status >= 300:
        raise error_from_envelope(response.status, response.body)
    return response
