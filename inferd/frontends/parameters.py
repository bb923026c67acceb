"""Request parameters the protocol reserves, and headers forwarded into parameters.

Triton's extension_parameters (docs/protocol/extension_parameters.md, server #8763): a request parameter
whose key starts with ``triton_`` is Triton's own. Over gRPC every such key but
``triton_enable_empty_final_response`` (a stream request's flag, read by the gRPC frontend) is refused
with INVALID_ARGUMENT; over HTTP every one is refused with 400. The other reserved keys
(``sequence_id``, ``sequence_start``, ``sequence_end``, ``priority``, ``timeout``, ``headers``,
``binary_data_output``) keep their protocol meaning where they are read.

``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern`` (Triton's flags): a request header
(gRPC metadata) whose name matches the regular expression anywhere, case-insensitively, becomes a string
request parameter of that name, as the model sees its parameters; a matching header that carries a
reserved name is refused. The checks are pure: plain keys in, a message or None out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from inferd.errors import InvalidArgument

TRITON_PREFIX = "triton_"
# The triton_ keys a gRPC request may carry (Triton's TRITON_RESERVED_REQUEST_PARAMS).
GRPC_TRITON_KEYS = ("triton_enable_empty_final_response",)
# Keys reserved for the protocol's own meaning (Triton's kReservedParameterKeys): never a forwarded header.
RESERVED_KEYS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                 "binary_data_output")

GRPC_RESERVED = ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                 "starting with 'triton_' are allowed: " + " ".join(GRPC_TRITON_KEYS))
HTTP_RESERVED = "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."


def reserved_parameter(keys: Iterable[str], protocol: str) -> str | None:
    """The first request parameter key of ``keys`` the protocol reserves (``protocol``: "grpc" or
    "http"), or None when every key may be sent."""
    for key in keys:
        if key.startswith(TRITON_PREFIX) and (protocol != "grpc" or key not in GRPC_TRITON_KEYS):
            return key
    return None


def check_request_parameters(model: str, keys: Iterable[str], protocol: str) -> None:
    """InvalidArgument (INVALID_ARGUMENT / 400) when a key is reserved: Triton's words, then the key and model."""
    key = reserved_parameter(keys, protocol)
    if key is not None:
        text = GRPC_RESERVED if protocol == "grpc" else HTTP_RESERVED
        raise InvalidArgument(f"{text} (request parameter '{key}' for model '{model}')")


def reserved_header_problem(name: str) -> str | None:
    """Triton's message when a header that matched the forward pattern carries a reserved name."""
    if name in RESERVED_KEYS or name.startswith(TRITON_PREFIX):
        return f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    return None


class HeaderForward:
    """A ``--*-header-forward-pattern``: which headers become request parameters."""

    __slots__ = ("pattern", "_regex")

    def __init__(self, pattern: str, flag: str = "--header-forward-pattern") -> None:
        try:
            # Triton prefixes the pattern with (?i) and matches it anywhere in the name (RE2 PartialMatch).
            self._regex = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"{flag}: '{pattern}' is not a regular expression: {exc}") from None
        self.pattern = pattern

    def forwarded(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The parameters the matching headers make (name -> value); InvalidArgument in Triton's
        words for a matching header with a reserved name."""
        out: dict[str, str] = {}
        search = self._regex.search
        for name, value in headers:
            if search(name):
                problem = reserved_header_problem(name)
                if problem is not None:
                    raise InvalidArgument(problem)
                out[name] = value
        return out


def header_forward(pattern: str | None, flag: str) -> HeaderForward | None:
    """The flag's forwarding, or None when the flag is not given (nothing is forwarded)."""
    return HeaderForward(pattern, flag) if pattern else None


def with_forwarded(parameters: Mapping[str, object] | None, forwarded: Mapping[str, str]) -> dict[str, object]:
    """The request's parameters with the forwarded headers added (a header wins over a parameter
    of the same name, as Triton sets it after the request's own)."""
    out = dict(parameters or {})
    out.update(forwarded)
    return out
