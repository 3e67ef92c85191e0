"""The console's own routes (§40): its page at `/ui`, its static files, sign-in and sign-out.

Everything the console shows it reads from the `/v0` API in the browser; these routes only
hand out the page and, in server mode, turn a token typed into the sign-in form into the
session cookie (§40.2). The token is read from a POST body, compared in constant time, and
never written into a page, a URL or a log. Must not import a store or the service layer.
"""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from rebuno.kernel.api.auth import Authenticator, Gate
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.session import CSRF_COOKIE, SESSION_COOKIE, mint_csrf, same_origin
from rebuno.kernel.config import Settings

STATIC = Path(__file__).with_name("static")
CONSOLE_PATH = "/ui"
SESSION_SECONDS = 12 * 3600
SECURITY_HEADERS = {
    # Only the console's own files run; nothing may frame it or post it elsewhere.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_SIGN_IN = (STATIC / "sign-in.html").read_text("utf-8")


def sign_in_page(message: str, status_code: int) -> HTMLResponse:
    notice = f'<p class="error" role="alert">{html.escape(message)}</p>' if message else ""
    return HTMLResponse(_SIGN_IN.replace("<!--notice-->", notice), status_code, SECURITY_HEADERS)


class ConsoleRoutes:
    def __init__(self, settings: Settings, authenticator: Authenticator, gate: Gate) -> None:
        self._dev = settings.dev
        self._auth = authenticator
        self._gate = gate
        self._shell = (STATIC / "index.html").read_text("utf-8")

    def routes(self) -> list[BaseRoute]:
        gate = self._gate
        return [
            route("/", GET=gate.open(self.home)),
            route(CONSOLE_PATH, GET=gate.open(self.shell)),
            route(
                CONSOLE_PATH + "/sign-in",
                GET=gate.open(self.sign_in_form),
                POST=gate.open(self.sign_in),
            ),
            route(CONSOLE_PATH + "/sign-out", POST=gate.open(self.sign_out)),
            Mount(CONSOLE_PATH + "/static", StaticFiles(directory=STATIC), name="console"),
        ]

    async def home(self, request: Request) -> Response:
        return RedirectResponse(CONSOLE_PATH, 302)

    async def shell(self, request: Request) -> Response:
        if not await self._signed_in(request):
            return RedirectResponse(CONSOLE_PATH + "/sign-in", 303)
        return HTMLResponse(self._shell, headers=SECURITY_HEADERS)

    async def sign_in_form(self, request: Request) -> Response:
        if self._dev:  # open, like the API: nothing to sign in to
            return RedirectResponse(CONSOLE_PATH, 303)
        return sign_in_page("", 200)

    async def sign_in(self, request: Request) -> Response:
        # A form posted from another site could sign the browser in as someone else.
        if not same_origin(request):
            return sign_in_page("Refused: the sign-in form was posted from another site.", 403)
        body = await self._gate.anyone(request)
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        token = (fields.get("token") or [""])[0].strip().encode("utf-8")
        if self._dev:
            return RedirectResponse(CONSOLE_PATH, 303)
        if not await self._auth.accepts(token):
            return sign_in_page("That token is not accepted.", 401)
        response = RedirectResponse(CONSOLE_PATH, 303)
        secure = request.url.scheme == "https"
        decoded = token.decode("utf-8")
        response.set_cookie(
            SESSION_COOKIE,
            decoded,
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=secure,
        )
        # Readable by the console's script, which repeats it in a header (§40.2).
        response.set_cookie(
            CSRF_COOKIE,
            mint_csrf(token),
            max_age=SESSION_SECONDS,
            samesite="strict",
            secure=secure,
        )
        return response

    async def sign_out(self, request: Request) -> Response:
        if not same_origin(request):
            return sign_in_page("Refused: sign-out was posted from another site.", 403)
        response = RedirectResponse(CONSOLE_PATH + "/sign-in", 303)
        response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict")
        response.delete_cookie(CSRF_COOKIE, samesite="strict")
        return response

    async def _signed_in(self, request: Request) -> bool:
        if self._dev:
            return True
        session = request.cookies.get(SESSION_COOKIE)
        return session is not None and await self._auth.accepts(session.encode("utf-8"))
