"""Domain errors, and the one table that maps them to gRPC and HTTP status.

Every failure the server reports is one of these types. Layers below the
frontends raise them; only the frontends translate them, through
:func:`grpc_status` and :func:`http_status`. Messages name the model, tensor
or field and the offending value, and say what would have been valid.
"""

from __future__ import annotations

import grpc


class InferdError(Exception):
    """Base of every error inferd reports to a client."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_code: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(InferdError):
    """The request (or a config) is malformed: wrong shape, type, name, size."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_code = 400


class NotFound(InferdError):
    """The named model, version, region or tensor does not exist."""

    grpc_code = grpc.StatusCode.NOT_FOUND
    http_code = 404


class Unavailable(InferdError):
    """The model exists but cannot take the request now (not ready, queue full,
    queue timeout, shutting down)."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_code = 503


class DeadlineExceeded(InferdError):
    """The client's own deadline passed before a response was ready."""

    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_code = 504


class Cancelled(InferdError):
    """The client cancelled or went away; nobody will read the answer."""

    grpc_code = grpc.StatusCode.CANCELLED
    http_code = 499


class Unimplemented(InferdError):
    """A protocol feature inferd does not provide (the message says which)."""

    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    http_code = 501


class AlreadyExists(InferdError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_code = 409


class ModelExecutionError(InferdError):
    """A model (its runtime or its Python code) failed while executing."""

    grpc_code = grpc.StatusCode.INTERNAL
    http_code = 500


class ConfigError(InferdError):
    """A model's configuration is invalid; raised at load, never per request."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_code = 400


def unknown_model(name: str, version: str | int | None = None) -> NotFound:
    # Triton's wording: clients (and perf_analyzer) match on this prefix.
    if version in (None, "", -1, 0):
        return NotFound(f"Request for unknown model: '{name}' is not found")
    return NotFound(f"Request for unknown model: '{name}' version {version} is not found")


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a client sees for ``exc``."""
    if isinstance(exc, InferdError):
        return exc.grpc_code, exc.message
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def http_status(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and message a client sees for ``exc``."""
    if isinstance(exc, InferdError):
        return exc.http_code, exc.message
    return 500, f"internal error: {type(exc).__name__}: {exc}"
