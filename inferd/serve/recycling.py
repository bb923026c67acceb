"""When a frontend worker is recycled: its memory grew past a bound (issue 42).

A frontend worker's heap grows for as long as it serves clients that cancel calls: grpc.aio leaks on
every client-cancelled call (grpc/grpc#43360, whose fixes are unmerged), +0.14 to +0.67 MiB/min per
worker in the 1M-request soak. Nothing inside the worker can give that memory back, so the core
replaces the worker instead, losing nothing:

1. Every ``check_s`` the core reads each worker's anonymous resident memory (``RssAnon`` in
   /proc/PID/status: the heap, where the leak is; the arenas are shared pages and do not count).
2. A worker past ``max_rss_bytes`` (and at least ``min_age_s`` old, so a bound below what a fresh
   worker needs cannot recycle in a loop) is recycled, one worker at a time: its replacement is
   started first, in its slot, and serves the same ports beside it (SO_REUSEPORT) before the old one
   is told ``RECYCLE``.
3. The old worker closes its ports as a closing server does (:meth:`GrpcPort.close
   <inferd.frontends.grpc_port.GrpcPort.close>`): it holds the gRPC calls it takes until its clients
   are quiet, shuts its gRPC server down (GOAWAY: a client's next call opens a connection, which only
   the other workers now take), and then *serves* the calls it held instead of refusing them; its
   HTTP port stops listening and finishes the requests it has. Once nothing is in flight it exits 0.

:func:`recycle_due` is the decision on plain data; the supervisor
(:mod:`inferd.serve.supervisor`) samples and acts.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_MIB = 1024  # far above a worker's working set (~100 MiB), reached by a leak after days
DEFAULT_CHECK_S = 10.0
AGE_CHECKS = 6  # a worker is at least this many checks old before it may be recycled
FLAG = "--frontend-worker-max-memory-mib"


@dataclass(frozen=True, slots=True)
class RecyclePolicy:
    """``max_rss_bytes``: a worker's anonymous memory past which it is replaced (0: never);
    ``check_s``: how often it is read; ``min_age_s``: how old a worker must be to be replaced."""

    max_rss_bytes: int = DEFAULT_MAX_MIB << 20
    check_s: float = DEFAULT_CHECK_S
    min_age_s: float = AGE_CHECKS * DEFAULT_CHECK_S

    def __post_init__(self) -> None:
        if self.max_rss_bytes < 0:
            raise ValueError(f"{FLAG} must be >= 0 (0: never recycle), got {self.max_rss_bytes >> 20}")
        if self.check_s <= 0:
            raise ValueError(f"--frontend-worker-memory-check-secs must be > 0, got {self.check_s}")

    @classmethod
    def from_flags(cls, max_mib: int, check_s: float = DEFAULT_CHECK_S) -> "RecyclePolicy":
        """The policy ``--frontend-worker-max-memory-mib`` and ``--frontend-worker-memory-check-secs`` ask for."""
        if max_mib < 0:
            raise ValueError(f"{FLAG} must be >= 0 (0: never recycle), got {max_mib}")
        return cls(max_mib << 20, check_s, AGE_CHECKS * check_s)

    @property
    def enabled(self) -> bool:
        return self.max_rss_bytes > 0


def recycle_due(policy: RecyclePolicy, rss_bytes: int | None, age_s: float) -> bool:
    """Whether a worker whose anonymous memory is ``rss_bytes`` (None: unknown), started ``age_s``
    seconds ago, is to be replaced now."""
    return policy.enabled and rss_bytes is not None and rss_bytes > policy.max_rss_bytes \
        and age_s >= policy.min_age_s


def anon_rss(pid: int) -> int | None:
    """Process ``pid``'s anonymous resident memory in bytes (None when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
