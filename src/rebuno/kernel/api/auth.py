"""Who is calling: bearer clients (the bootstrap token, scoped API keys, §34) and HMAC-signed
agents (§2), behind the body cap (§3.3).

Every route enters through a handler `Gate` made for it, which declares its access: a bearer
caller is authenticated and its scopes checked before the body is read, an agent's known id
too, and its signature once the body is in. Bearer tokens, key tokens and agent secrets are
compared in constant time and are never logged or echoed. Must not import a store backend or
`kernel.webhooks`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from rebuno.kernel.api.body import read_body
from rebuno.kernel.api.errors import Endpoint
from rebuno.kernel.api.params import is_agent_id
from rebuno.kernel.api.routing import Access, Credential, Handler
from rebuno.kernel.api.session import SESSION_COOKIE, require_csrf
from rebuno.kernel.config import Settings
from rebuno.kernel.domain.api_key import TOKEN_PREFIX
from rebuno.kernel.domain.errors import Unauthorized
from rebuno.kernel.domain.principal import ANONYMOUS, BOOTSTRAP, Principal
from rebuno.kernel.domain.records import SeenRequest
from rebuno.protocol.enums import Scope
from rebuno.protocol.signing import (
    AGENT_ID_HEADER,
    BODY_SCHEME_PREFIX,
    DISPATCH_ATTEMPT_HEADER,
    DISPATCH_ID_HEADER,
    REQUEST_SCHEME_PREFIX,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TIMESTAMP_WINDOW_SECONDS,
    verify_body,
    verify_request,
)

SecretLookup = Callable[[str], Awaitable[str | None]]
KeyLookup = Callable[[str], Awaitable[Principal | None]]
"""A key token to the principal of the live key it names, or None."""
BEARER_PREFIX = "Bearer "
_BAD_BEARER = "unauthorized: missing or invalid bearer token"
PRINCIPAL_SCOPE_KEY = "rebuno.principal"
"""Where an admitted bearer request's principal waits in the ASGI scope for its handler."""
_SIGNATURE_FAILED = "unauthorized: agent signature does not verify"
SEEN_MARGIN_SECONDS = 60.0
"""How much longer than the timestamp window a request is remembered (§2.3): room for the
clocks of the replicas to differ."""
_SEEN_TAG = b"rebuno-seen-request\n"


@dataclass(frozen=True, slots=True)
class SignedFields:
    """The header values a `v1=` signature covers, each present at most once."""

    timestamp: str
    dispatch_id: str
    attempt: str


class Authenticator:
    """Checks bearer tokens and agent signatures against the settings, the API keys and the
    agent secrets."""

    def __init__(
        self,
        settings: Settings,
        secret_of: SecretLookup,
        clock: Callable[[], datetime],
        key_of: KeyLookup,
    ) -> None:
        self._dev = settings.dev
        token = settings.bearer_token or ""
        self._bootstrap = token.encode("utf-8") if token else None
        self._accept_body_scheme = settings.accept_body_signatures
        self._secret_of = secret_of
        self._key_of = key_of
        self._clock = clock

    async def authenticate(self, request: Request) -> Principal:
        """The principal of a bearer request (§34.1), or `Unauthorized`. Server mode: the token
        `client_token` extracts (the one `Authorization: Bearer` header, else the console's
        session cookie with its CSRF check). Dev mode: a `Bearer rbk_…` header is verified as
        in server mode, anything else is anonymous."""
        if self._dev:
            values = request.headers.getlist("authorization")
            presented = values[0] if len(values) == 1 else ""
            if not presented.startswith(BEARER_PREFIX + TOKEN_PREFIX):
                return ANONYMOUS
        token = client_token(request)
        if token is None:
            raise Unauthorized(_BAD_BEARER)
        return await self.verify_token(token)

    async def verify_token(self, received: bytes) -> Principal:
        """The principal a presented token authenticates, wherever it was presented: the
        bootstrap token, or a live API key's token (§34.4); else `Unauthorized`."""
        if self._bootstrap is not None and hmac.compare_digest(received, self._bootstrap):
            return BOOTSTRAP
        prefix = TOKEN_PREFIX.encode("ascii")
        if (
            received.startswith(prefix)
            and received.isascii()
            and (principal := await self._key_of(received.decode("ascii")))
        ):
            return principal
        raise Unauthorized(_BAD_BEARER)

    async def accepts(self, token: bytes) -> bool:
        """Whether `token` authenticates anyone (the console's sign-in, §40.2)."""
        try:
            await self.verify_token(token)
        except Unauthorized:
            return False
        return True

    async def require_known_agent(self, headers: Headers) -> KnownAgent:
        """The agent the headers name, with its secret, checked before any body is read: a
        request naming no agent, or an unknown one, is refused without reading it."""
        agent_id = _exactly_once(headers, AGENT_ID_HEADER)
        if not is_agent_id(agent_id):  # never looked up, so never remembered either
            raise Unauthorized(_SIGNATURE_FAILED)
        signature = _exactly_once(headers, SIGNATURE_HEADER)
        secret = await self._secret_of(agent_id)
        if secret is None:
            raise Unauthorized(_SIGNATURE_FAILED)
        return KnownAgent(agent_id, signature, secret)

    def require_agent(self, request: Request, body: bytes, known: KnownAgent) -> AgentCaller:
        """The authenticated agent and its request, or `Unauthorized`: the signature
        `known` read from the headers, checked over the body."""
        agent_id, signature, secret = known.agent_id, known.signature, known.secret
        fields = _signed_fields(request.headers)
        if signature.startswith(REQUEST_SCHEME_PREFIX):
            if not self._verify_request(request.scope, secret, fields, body, signature):
                raise Unauthorized(_SIGNATURE_FAILED)
            return AgentCaller(body, agent_id, signature, fields.timestamp)
        if not (signature.startswith(BODY_SCHEME_PREFIX) and self._accept_body_scheme):
            raise Unauthorized("unauthorized: unsupported Rebuno-Signature scheme")
        if not verify_body(secret, body, signature):
            raise Unauthorized(_SIGNATURE_FAILED)
        return AgentCaller(body, agent_id)

    def _verify_request(
        self,
        scope: Mapping[str, Any],
        secret: str,
        fields: SignedFields,
        body: bytes,
        signature: str,
    ) -> bool:
        return verify_request(
            secret,
            str(scope["method"]),
            request_target(scope),
            fields.timestamp,
            fields.dispatch_id,
            fields.attempt,
            body,
            signature,
            now=self._clock().timestamp(),
        )


def client_token(request: Request) -> bytes | None:
    """The credential a client presents (§2.1, §40.2), or None: the token of the one
    `Authorization: Bearer` header, else the console's session cookie, which a request that
    changes state must back with its CSRF token. Only extracts; `Authenticator` verifies."""
    values = request.headers.getlist("authorization")
    if values:
        # Header text arrives latin-1 decoded; encoding it back gives the bytes as sent.
        received = values[0].encode("latin-1", "replace")
        prefix = BEARER_PREFIX.encode("ascii")
        return received[len(prefix) :] if len(values) == 1 and received.startswith(prefix) else None
    session = request.cookies.get(SESSION_COOKIE)
    if not session:
        return None
    token = session.encode("utf-8")
    require_csrf(request, token)
    return token


def seen_request(agent_id: str, signature: str, timestamp: str) -> SeenRequest:
    """A verified `v1=` request (its signature is ASCII hex, its timestamp whole seconds within
    the window) as the kernel remembers it (§2.3): the signature is a MAC of
    everything the request says, so equal digests mean a byte-identical copy. Kept until the
    copy's timestamp leaves the window, plus a margin for the replicas' clocks."""
    material = _SEEN_TAG + agent_id.encode("utf-8") + b"\n" + signature.encode("ascii")
    until = int(timestamp) + TIMESTAMP_WINDOW_SECONDS + SEEN_MARGIN_SECONDS
    return SeenRequest(hashlib.sha256(material).digest(), datetime.fromtimestamp(until, UTC))


def is_agent_request(headers: Headers) -> bool:
    """A request with agent headers is authenticated as an agent, never as a client (§2.4)."""
    return AGENT_ID_HEADER in headers or SIGNATURE_HEADER in headers


def request_target(scope: Mapping[str, Any]) -> bytes:
    """The request target exactly as received: raw path, then `?` and the raw query."""
    raw_path = scope.get("raw_path") or str(scope["path"]).encode("utf-8")
    query = scope.get("query_string") or b""
    return bytes(raw_path) + b"?" + bytes(query) if query else bytes(raw_path)


def _exactly_once(headers: Headers, name: str) -> str:
    values = headers.getlist(name)
    if not values or not values[0]:
        raise Unauthorized(f"unauthorized: missing {name}")
    if len(values) > 1:
        raise Unauthorized(f"unauthorized: {name} given more than once")
    _reject_line_breaks(name, values[0])
    return values[0]


def _at_most_once(headers: Headers, name: str) -> str:
    values = headers.getlist(name)
    if len(values) > 1:
        raise Unauthorized(f"unauthorized: {name} given more than once")
    value = values[0] if values else ""
    _reject_line_breaks(name, value)
    return value


def _reject_line_breaks(name: str, value: str) -> None:
    if "\r" in value or "\n" in value:
        raise Unauthorized(f"unauthorized: {name} contains a line break")


def _signed_fields(headers: Headers) -> SignedFields:
    return SignedFields(
        timestamp=_at_most_once(headers, TIMESTAMP_HEADER),
        dispatch_id=_at_most_once(headers, DISPATCH_ID_HEADER),
        attempt=_at_most_once(headers, DISPATCH_ATTEMPT_HEADER),
    )


@dataclass(frozen=True, slots=True)
class KnownAgent:
    """An agent's request as its headers name it, before its body is read: the agent, the
    signature it sent and the agent's secret."""

    agent_id: str
    signature: str
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated request: its body, and the agent id when an agent signed it."""

    body: bytes
    agent_id: str | None


@dataclass(frozen=True, slots=True)
class AgentCaller:
    """A request signed by an agent: with the `v1=` scheme, its signature and timestamp."""

    body: bytes
    agent_id: str
    signature: str = ""
    timestamp: str = ""

    def seen(self) -> SeenRequest | None:
        """What the kernel remembers of this request against a copy (§2.3); None for the
        body scheme, whose requests carry no time. Worked out only by the routes that use
        it, so a step submission pays nothing for it."""
        if not self.timestamp:
            return None
        return seen_request(self.agent_id, self.signature, self.timestamp)


class Gate:
    """The entry of every route: the credentials that need no body first (a bearer token
    and its scopes; a known agent id), then the body under its cap, then the signature
    over it.

    `scoped`, `scoped_or_agent`, `signed` and `open` make a route's handlers (§34.2); inside
    an endpoint, `client`, `principal`, `agent`, `client_or_agent` and `anyone` read the body
    of the caller its handler admitted."""

    def __init__(self, settings: Settings, authenticator: Authenticator) -> None:
        self._limit = settings.max_body_bytes
        self._timeout = settings.body_timeout.total_seconds()
        self._auth = authenticator

    # -- what a route declares ---------------------------------------------------------
    def scoped(self, endpoint: Endpoint, *scopes: Scope) -> Handler:
        """A bearer route: the caller must hold every one of `scopes`, checked before the
        path or the body is looked at (401, then 403)."""
        return Handler(Access(Credential.BEARER, scopes), self._admit_bearer(endpoint, scopes))

    def scoped_or_agent(self, endpoint: Endpoint, *scopes: Scope) -> Handler:
        """A bearer route that a signed agent may also call (a request with agent headers is
        an agent's, never retried as bearer, §2.4)."""
        admitted = self._admit_bearer(endpoint, scopes)

        async def either(request: Request) -> Response:
            if is_agent_request(request.headers):
                return await endpoint(request)  # it calls `client_or_agent`, which verifies
            return await admitted(request)

        return Handler(Access(Credential.BEARER_OR_AGENT, scopes), either)

    def signed(self, endpoint: Endpoint) -> Handler:
        """An agent route (HMAC only): its endpoint calls `agent`, which verifies."""
        return Handler(Access(Credential.AGENT), endpoint)

    def open(self, endpoint: Endpoint) -> Handler:
        """A route anyone may call (health, readiness, metrics, the API document)."""
        return Handler(Access(Credential.NONE), endpoint)

    def _admit_bearer(self, endpoint: Endpoint, scopes: tuple[Scope, ...]) -> Endpoint:
        async def admit(request: Request) -> Response:
            principal = await self._auth.authenticate(request)
            for scope in scopes:
                principal.require(scope)
            request.scope[PRINCIPAL_SCOPE_KEY] = principal
            return await endpoint(request)

        return admit

    # -- what an endpoint reads --------------------------------------------------------
    async def client(self, request: Request) -> bytes:
        """The body of a bearer request its handler admitted."""
        admitted_principal(request)
        return await read_body(request, self._limit, self._timeout)

    async def principal(self, request: Request) -> tuple[bytes, Principal]:
        """`client`, and who the caller is (§34.5)."""
        principal = admitted_principal(request)
        return await read_body(request, self._limit, self._timeout), principal

    async def agent(self, request: Request) -> AgentCaller:
        known = await self._auth.require_known_agent(request.headers)
        body = await read_body(request, self._limit, self._timeout)
        return self._auth.require_agent(request, body, known)

    async def client_or_agent(self, request: Request) -> Caller:
        if is_agent_request(request.headers):
            agent = await self.agent(request)
            return Caller(agent.body, agent.agent_id)
        return Caller(await self.client(request), None)

    async def anyone(self, request: Request) -> bytes:
        return await read_body(request, self._limit, self._timeout)


def admitted_principal(request: Request) -> Principal:
    """The principal a bearer handler admitted; fails closed (401) on a request no bearer
    handler admitted, so an endpoint declared with the wrong access reads no body."""
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if not isinstance(principal, Principal):
        raise Unauthorized(_BAD_BEARER)
    return principal
