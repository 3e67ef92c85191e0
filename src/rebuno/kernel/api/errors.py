"""The only table from error code to HTTP status, and the error envelope (§3.1, §3.2).

A `KernelError` becomes `{"code", "message", "details"?}` with the status its code maps to;
anything else becomes a 500 `internal_error` whose traceback is logged and whose text is never
sent. Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from rebuno.kernel.api.schemas import json_response
from rebuno.kernel.domain.errors import KernelError
from rebuno.protocol.codes import HTTP_STATUS, ErrorCode

logger = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]


def status_of(code: ErrorCode) -> int:
    return HTTP_STATUS.get(code, 500)


def error_response(
    code: ErrorCode, message: str, details: str = "", headers: dict[str, str] | None = None
) -> Response:
    body = {"code": code.value, "message": message}
    if details:
        body["details"] = details
    response = json_response(body, status_of(code))
    response.headers.update(headers or {})
    return response


def kernel_error_response(exc: KernelError) -> Response:
    if exc.code is ErrorCode.INTERNAL_ERROR:
        # An outage message names servers and drivers: log it, answer generically.
        logger.error("request failed: %s", exc.message)
        return internal_error_response()
    return error_response(exc.code, exc.message, exc.details)


def internal_error_response() -> Response:
    return error_response(ErrorCode.INTERNAL_ERROR, "internal error")


def guarded(endpoint: Endpoint) -> Endpoint:
    """Wraps a route so every failure leaves as an error envelope."""

    @functools.wraps(endpoint)
    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except KernelError as exc:
            return kernel_error_response(exc)
        except ClientDisconnect:
            # The caller went away mid-body: nobody is left to answer, and nothing failed.
            logger.debug("client disconnected on %s %s", request.method, request.url.path)
            return Response(status_code=400)
        except Exception:
            logger.exception("unhandled error on %s %s", request.method, request.url.path)
            return internal_error_response()

    return run


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route) and 405 (known path, wrong method), as envelopes."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 405:
        return error_response(
            ErrorCode.METHOD_NOT_ALLOWED,
            f"method {request.method} not allowed on {request.url.path}",
            headers=dict(getattr(exc, "headers", None) or {}),
        )
    if status == 404:
        return error_response(ErrorCode.NOT_FOUND, f"no route for {request.url.path}")
    logger.error("unexpected HTTP exception %s on %s", status, request.url.path)
    return internal_error_response()
