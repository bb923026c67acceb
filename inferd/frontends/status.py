"""The one table from domain error kinds to gRPC and HTTP status codes.

Owned by the frontends: the layers below raise :mod:`inferd.errors` types,
each with a protocol-neutral ``kind``; only here does a kind become a wire
status. Anything that is not an :class:`InferdError` is an internal error.
"""

from __future__ import annotations

import grpc

from inferd.errors import InferdError

# kind -> (gRPC status, HTTP status)
STATUS: dict[str, tuple[grpc.StatusCode, int]] = {
    "INVALID_ARGUMENT": (grpc.StatusCode.INVALID_ARGUMENT, 400),
    "NOT_FOUND": (grpc.StatusCode.NOT_FOUND, 404),
    "ALREADY_EXISTS": (grpc.StatusCode.ALREADY_EXISTS, 409),
    "CANCELLED": (grpc.StatusCode.CANCELLED, 499),
    "INTERNAL": (grpc.StatusCode.INTERNAL, 500),
    "UNIMPLEMENTED": (grpc.StatusCode.UNIMPLEMENTED, 501),
    "UNAVAILABLE": (grpc.StatusCode.UNAVAILABLE, 503),
    "DEADLINE_EXCEEDED": (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    "PERMISSION_DENIED": (grpc.StatusCode.PERMISSION_DENIED, 403),
    "RESOURCE_EXHAUSTED": (grpc.StatusCode.RESOURCE_EXHAUSTED, 413),
}
_INTERNAL = STATUS["INTERNAL"]


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a client sees for ``exc``."""
    if isinstance(exc, InferdError):
        return STATUS.get(exc.kind, _INTERNAL)[0], exc.message
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def http_status(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and message a client sees for ``exc``."""
    if isinstance(exc, InferdError):
        return STATUS.get(exc.kind, _INTERNAL)[1], exc.message
    return 500, f"internal error: {type(exc).__name__}: {exc}"
