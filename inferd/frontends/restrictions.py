"""Restricted endpoints, as Triton's ``--grpc-restricted-protocol`` and ``--http-restricted-api``.

Each flag is ``<groups>:<key>=<value>``: a comma-separated list of endpoint
groups, and the header a request to any of them must carry (with exactly that
value). A group may be named in one flag only. gRPC's header is
``triton-grpc-protocol-<key>`` (metadata keys are lowercase on the wire), HTTP's
is ``<key>`` itself, as in Triton. A request to a restricted group without the
header is refused with PERMISSION_DENIED (gRPC) / 403 (HTTP), in Triton's
words, and logged with the endpoint and the peer. (Triton answers a refused
gRPC call UNAVAILABLE, which clients retry; inferd says what it is.)

Both frontends build one :class:`Restrictions` from the flags and ask it per
request (:meth:`Restrictions.refusal`); an unrestricted group costs one dict
lookup.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping

from inferd.errors import PermissionDenied

log = logging.getLogger("inferd.restricted")

# Triton's groups (src/restricted_features.h), in its order.
GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
          "trace", "logging")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# gRPC method -> group, as Triton assigns them (the health service's Check and Watch are "health").
GRPC_METHODS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health", "Watch": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "TraceSetting": "trace",
    "LogSettings": "logging",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
}


@dataclass(frozen=True, slots=True)
class Restriction:
    header: str  # lowercase for gRPC metadata; HTTP headers are matched without case
    value: str


@dataclass(frozen=True)
class Restrictions:
    """group -> the header (and value) a request to it must carry; groups not named are open."""

    by_group: Mapping[str, Restriction] = field(default_factory=dict)
    protocol: str = "API"  # Triton's word in the refusal: "protocol" (gRPC) or "API" (HTTP)

    def __bool__(self) -> bool:
        return bool(self.by_group)

    @classmethod
    def parse(cls, specs: list[str], flag: str, header_prefix: str = "", protocol: str = "API") -> "Restrictions":
        """Restrictions from the flag's values; ValueError naming the flag and the value when one is wrong."""
        by_group: dict[str, Restriction] = {}
        for spec in specs:
            groups, sep, pair = spec.partition(":")
            key, eq, value = pair.partition("=")
            if not sep or not eq or not groups.strip() or not key.strip():
                raise ValueError(f"{flag} '{spec}': expected <groups>:<key>=<value>, e.g. "
                                 f"{flag}=model-repository,shared-memory:admin-key=secret")
            header = header_prefix + key.strip()
            for group in (g.strip() for g in groups.split(",")):
                if group not in GROUPS:
                    raise ValueError(f"{flag} '{spec}': unknown group '{group}'; known: {', '.join(GROUPS)}")
                if group in by_group:
                    raise ValueError(f"{flag}: group '{group}' is restricted twice; a group may be in one flag only")
                by_group[group] = Restriction(header.lower() if header_prefix else header, value)
        return cls(by_group, protocol)

    def to_plain(self) -> dict[str, list[str]]:
        """As plain data (a frontend worker's configuration travels as msgpack): group -> [header, value]."""
        return {group: [r.header, r.value] for group, r in self.by_group.items()}

    @classmethod
    def from_plain(cls, doc: dict[str, list[str]] | None, protocol: str = "API") -> "Restrictions":
        return cls({group: Restriction(header, value) for group, (header, value) in (doc or {}).items()}, protocol)

    def refusal(self, group: str, headers: Callable[[str], str | None], endpoint: str,
                peer: str = "") -> PermissionDenied | None:
        """The error to answer a request to ``group`` with (logged), or None when it may go on.
        ``headers(name)``: the request's value for a header, or None."""
        rule = self.by_group.get(group)
        if rule is None or headers(rule.header) == rule.value:
            return None
        log.warning("refused %s (%s, restricted): no '%s' header with the expected value%s",
                    endpoint, group, rule.header, f" from {peer}" if peer else "")
        return PermissionDenied(f"This {self.protocol} is restricted, expecting header '{rule.header}'")
