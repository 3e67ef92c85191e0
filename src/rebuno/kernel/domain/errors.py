"""KernelError and its subclasses; each declares its stable code from `protocol.codes`.

Must not import anything outside `rebuno.protocol` (the domain's records only for types).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rebuno.protocol.codes import ErrorCode

if TYPE_CHECKING:
    from rebuno.kernel.domain.records import Lease


class KernelError(Exception):
    """Root of every error the kernel turns into an error envelope."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ValidationFailed(KernelError):
    code = ErrorCode.VALIDATION_ERROR


class Unauthorized(KernelError):
    code = ErrorCode.UNAUTHORIZED


class Forbidden(KernelError):
    code = ErrorCode.FORBIDDEN


class NotFound(KernelError):
    code = ErrorCode.NOT_FOUND


class Conflict(KernelError):
    code = ErrorCode.CONFLICT


class ExecutionTerminal(KernelError):
    code = ErrorCode.EXECUTION_TERMINAL


class LeaseSuperseded(KernelError):
    code = ErrorCode.LEASE_SUPERSEDED


class MethodNotAllowed(KernelError):
    code = ErrorCode.METHOD_NOT_ALLOWED


class PayloadTooLarge(KernelError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class RequestTimeout(KernelError):
    code = ErrorCode.REQUEST_TIMEOUT


class Unavailable(KernelError):
    """The store cannot be reached; rendered as a 500 but retried by background loops."""

    code = ErrorCode.INTERNAL_ERROR


def lease_superseded(execution_id: str, lease: Lease) -> LeaseSuperseded:
    return LeaseSuperseded(
        f"lease superseded: dispatch {lease.dispatch_id} attempt {lease.attempt} "
        f"no longer owns execution {execution_id}"
    )
