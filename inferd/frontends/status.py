"""The one table from domain error kinds to gRPC and HTTP status codes.

Owned by the frontends: the layers below raise :mod:`inferd.errors` types,
each with a protocol-neutral ``kind``; only here does a kind become a wire
status. Anything that is not an :class:`InferdError` is an internal error.
"""

from __future__ import annotations

import grpc

from inferd.errors import Draining, InferdError

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
# A response header (gRPC: metadata of a trailers-only answer) on which Envoy marks the upstream host failed
# at once, as if its active health check had failed. A draining server's refusals carry it, so that a load
# balancer in front stops sending here now rather than at its next check: until then least-request keeps
# picking the draining replica (it answers fastest), and a retry may be sent back to it.
DRAINING_HEADER = "x-envoy-immediate-health-check-fail"
Metadata = tuple[tuple[str, str], ...]


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a client sees for ``exc``."""
    if isinstance(exc, InferdError):
        return STATUS.get(exc.kind, _INTERNAL)[0], exc.message
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def grpc_abort(exc: BaseException) -> tuple[grpc.StatusCode, str, Metadata]:
    """What ``context.abort`` is given for ``exc``: its gRPC status, message and trailing metadata."""
    code, message = grpc_status(exc)
    return code, message, error_headers(exc)


def error_headers(exc: BaseException) -> Metadata:
    """The headers (gRPC: trailing metadata) an error's answer carries besides its status and message."""
    return ((DRAINING_HEADER, "true"),) if isinstance(exc, Draining) else ()


def http_status(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and message a client sees for ``exc``."""
    if isinstance(exc, InferdError):
        return STATUS.get(exc.kind, _INTERNAL)[1], exc.message
    return 500, f"internal error: {type(exc).__name__}: {exc}"
