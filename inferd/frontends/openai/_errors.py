"""OpenAI's error body and its status codes.

Every ``/v1`` failure answers ``{"error": {"message", "type", "param", "code"}}``. The status is the
one table's (:func:`inferd.frontends.status.http_status`); the ``type`` is the word OpenAI uses for that
status, which the ``openai`` client turns into its exception classes (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 429 RateLimitError, 5xx
InternalServerError, the 5xx and 429 retried). Overload and drain stay 503: retryable.
"""

from __future__ import annotations

import logging
from typing import Any

from inferd.errors import InferdError, InvalidArgument
from inferd.frontends.status import http_status

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error"}


class RequestError(InvalidArgument):
    """A bad ``/v1`` request field: 400, with the field in ``param`` and OpenAI's ``code`` when it has one."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class AuthenticationFailed(InferdError):
    """No API key, or a wrong one (401)."""

    kind = "UNAUTHENTICATED"


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and the JSON body a client sees for ``exc``."""
    if isinstance(exc, AuthenticationFailed):
        status, message = 401, exc.message
    else:
        status, message = http_status(exc)
        if not isinstance(exc, InferdError):
            log.exception("unexpected error", exc_info=exc)
    param = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    if code is None and isinstance(exc, InferdError) and status == 404:
        code = "model_not_found" if "model" in message else None
    if isinstance(exc, AuthenticationFailed):
        code = "invalid_api_key"
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}
