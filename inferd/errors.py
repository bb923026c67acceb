"""Domain errors: every failure the server reports is one of these types.

Layers below the frontends raise them; each has a ``kind`` (named as the gRPC
status names it, which is also the failure reason statistics count it under),
and only the frontends turn a kind into a status code, through the one table
in :mod:`inferd.frontends.status`. Nothing here knows a wire protocol. Messages
name the model, tensor or field and the offending value, and say what would
have been valid.
"""

from __future__ import annotations

from collections.abc import Iterable


class InferdError(Exception):
    """Base of every error inferd reports to a client."""

    kind: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(InferdError):
    """The request (or a config) is malformed: wrong shape, type, name, size."""

    kind = "INVALID_ARGUMENT"


class NotFound(InferdError):
    """The named model, version, region or tensor does not exist."""

    kind = "NOT_FOUND"


class Unavailable(InferdError):
    """The model exists but cannot take the request now (not ready, queue full,
    queue timeout, shutting down)."""

    kind = "UNAVAILABLE"


class Draining(Unavailable):
    """The server is shutting down and takes no new work here; the call may be retried on another
    server. The frontends also tell a load balancer in front to stop sending here at once
    (:mod:`inferd.frontends.status`), rather than at its next health check."""


class SloRefused(Unavailable):
    """Refused when it arrived: the model's latency SLO (``inferd.max_latency_microseconds``)
    could not be met by the estimate (admission control). Counted under its own reason."""

    reason = "SLO_REFUSED"


class DeadlineExceeded(InferdError):
    """The client's own deadline passed before a response was ready."""

    kind = "DEADLINE_EXCEEDED"


class Cancelled(InferdError):
    """The client cancelled or went away; nobody will read the answer."""

    kind = "CANCELLED"


class PermissionDenied(InferdError):
    """The endpoint is restricted and the request lacks the header that opens it."""

    kind = "PERMISSION_DENIED"


class TooLarge(InferdError):
    """The request is larger than the server accepts (a message or body size limit)."""

    kind = "RESOURCE_EXHAUSTED"


class ResourceExhausted(InferdError):
    """A per-request bound was reached: a stream's client fell too far behind its model
    (the message names the limit and the flag that sets it)."""

    kind = "RESOURCE_EXHAUSTED"


class Unimplemented(InferdError):
    """A protocol feature inferd does not provide (the message says which)."""

    kind = "UNIMPLEMENTED"


class AlreadyExists(InferdError):
    kind = "ALREADY_EXISTS"


class ModelExecutionError(InferdError):
    """A model (its runtime or its Python code) failed while executing."""

    kind = "INTERNAL"


class RepositoryPollError(InferdError):
    """The files a load request sent could not be made into a model folder. INTERNAL, as
    Triton answers it ("failed to poll from model repository"); its clients match on that."""

    kind = "INTERNAL"


class ConfigError(InferdError):
    """A model's configuration is invalid; raised at load, never per request."""

    kind = "INVALID_ARGUMENT"


def unknown_model(name: str, version: str | int | None = None, *, known_models: Iterable[str] = (),
                  loaded_versions: Iterable[int] = ()) -> NotFound:
    """``known_models``: the names a misspelt one may have meant; ``loaded_versions``:
    the versions of ``name`` there are, listed when another was asked for."""
    # Triton's wording: clients (and perf_analyzer) match on this prefix.
    if version in (None, "", -1, 0):
        from inferd.suggest import did_you_mean  # here: difflib for a misspelt name only, never at start

        return NotFound(f"Request for unknown model: '{name}' is not found{did_you_mean(name, known_models)}")
    loaded = ", ".join(str(v) for v in sorted(loaded_versions))
    return NotFound(f"Request for unknown model: '{name}' version {version} is not found"
                    + (f"; loaded versions: {loaded}" if loaded else ""))
