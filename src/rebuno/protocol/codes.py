"""Stable error codes of the error envelope, with their HTTP status. Standard library only.

Both the kernel (to render errors) and the SDK (to choose an exception class) read this
table, so the two sides can never disagree.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    VALIDATION_ERROR = "validation_error"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    EXECUTION_TERMINAL = "execution_terminal"
    LEASE_SUPERSEDED = "lease_superseded"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    POLICY_DENIED = "policy_denied"
    INTERNAL_ERROR = "internal_error"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.VALIDATION_ERROR: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.EXECUTION_TERMINAL: 409,
    ErrorCode.LEASE_SUPERSEDED: 409,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.POLICY_DENIED: 403,
    ErrorCode.INTERNAL_ERROR: 500,
}
