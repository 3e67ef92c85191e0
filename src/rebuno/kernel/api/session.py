"""The console's session (§40.2): the cookie that carries a signed-in token, and the CSRF
token a state-changing request authenticated by that cookie must repeat in a header.

The CSRF token is `<nonce>.<mac>`, the MAC keyed by the session's own token, so it is
fresh for each sign-in, holds on every replica without shared state, and cannot be made
by anyone who does not hold the token. Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request

from rebuno.kernel.domain.errors import Forbidden

SESSION_COOKIE = "rebuno_session"
CSRF_COOKIE = "rebuno_csrf"
CSRF_HEADER = "rebuno-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CSRF_TAG = b"rebuno-console-csrf\n"
_REFUSED = "forbidden: a state-changing console request needs its CSRF token, from the same origin"


def mint_csrf(token: bytes) -> str:
    """A new CSRF token for a session of `token`."""
    nonce = secrets.token_hex(16)
    return f"{nonce}.{_mac(token, nonce)}"


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another site or origin: by
    `Sec-Fetch-Site` when it sends one, else by `Origin` against the `Host` it was sent to.
    A request with neither (not a browser's) passes; the CSRF token still has to match."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def require_csrf(request: Request, token: bytes) -> None:
    """Raises `Forbidden` unless a request that changes state comes from the console's own
    origin with the CSRF token of this session, both in its cookie and its header."""
    if request.method in SAFE_METHODS:
        return
    sent = request.headers.get(CSRF_HEADER, "").encode("utf-8", "replace")
    kept = request.cookies.get(CSRF_COOKIE, "").encode("utf-8", "replace")
    if not (same_origin(request) and sent and hmac.compare_digest(sent, kept)):
        raise Forbidden(_REFUSED)
    nonce, _, mac = kept.decode("utf-8", "replace").partition(".")
    if not hmac.compare_digest(mac.encode("utf-8"), _mac(token, nonce).encode("ascii")):
        raise Forbidden(_REFUSED)


def _mac(token: bytes, nonce: str) -> str:
    return hmac.new(token, _CSRF_TAG + nonce.encode("utf-8"), hashlib.sha256).hexdigest()
