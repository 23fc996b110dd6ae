"""Exceptions: one class per gRPC status code, all subclasses of :class:`VerifydError`.

Every failed RPC raises the subclass of its status code, with the server's message in
``details``; the original :class:`grpc.RpcError` is chained as ``__cause__``. What verifyd
means by each code (see verify.proto):

=========================  ===================================================================
``NotFound``               unknown, closed or expired session
``InvalidArgument``        bad request; the message names the field (``items[0].tree.parents[1]``)
``ResourceExhausted``      KV pool, session table or request queue full: retry later
``Aborted``                ``expected_committed_len`` differs from the session's; nothing applied
``Unavailable``            server draining, engine failed, or not reachable
``DeadlineExceeded``       the call's deadline passed (a started Verify may still be applied)
``Unauthenticated``        missing or wrong bearer token
``PermissionDenied``       the session belongs to another client
=========================  ===================================================================
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

import grpc

__all__ = [
    "VerifydError",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "UnsupportedField",
    "error_class",
    "from_rpc_error",
]


class VerifydError(Exception):
    """A failed verifyd RPC.

    Attributes:
        code: the gRPC status code.
        details: the server's message (for INVALID_ARGUMENT it names the offending field).
        attempts: how many times the client sent the call (> 1 when it was retried).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        details: str = "",
        *,
        code: Optional[grpc.StatusCode] = None,
        method: str = "",
        attempts: int = 1,
    ) -> None:
        if code is not None:
            self.code = code
        self.details = details
        self.method = method
        self.attempts = attempts
        super().__init__(details)

    def __str__(self) -> str:
        where = f"{self.method}: " if self.method else ""
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"{where}{self.code.name}: {self.details}{tries}"


class Cancelled(VerifydError):
    code = grpc.StatusCode.CANCELLED


class Unknown(VerifydError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(VerifydError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(VerifydError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(VerifydError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(VerifydError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(VerifydError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(VerifydError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(VerifydError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(VerifydError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(VerifydError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(VerifydError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(VerifydError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(VerifydError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(VerifydError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(VerifydError):
    code = grpc.StatusCode.UNAUTHENTICATED


class UnsupportedField(TypeError):
    """A keyword argument names a field that the installed stubs' verify.proto lacks.

    The stubs ship with the package (made from verifyd's proto by scripts/regen_stubs.sh):
    install the client from a verifyd release or source tree whose proto has the field.
    """


_BY_CODE: Dict[grpc.StatusCode, Type[VerifydError]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def error_class(code: grpc.StatusCode) -> Type[VerifydError]:
    """The exception class of a status code (VerifydError itself for an unexpected one)."""
    return _BY_CODE.get(code, VerifydError)


def _code_and_details(err: Any) -> tuple[grpc.StatusCode, str]:
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    return code, details if details is not None else str(err)


def from_rpc_error(err: grpc.RpcError, *, method: str = "", attempts: int = 1) -> VerifydError:
    """The VerifydError subclass for a grpc.RpcError (sync or aio) with its code and details."""
    code, details = _code_and_details(err)
    cls = error_class(code)
    return cls(details, code=code, method=method, attempts=attempts)
