"""The gRPC door: a bound on the calls a server holds, counting those gRPC holds for it unseen.

This is grpc.aio's door (``--grpc-front grpcio``). Behind the gRPC front (the default) the same flag is
Envoy's circuit breaker on the bridged calls, on by default (:mod:`inferd.serve.grpc_front`), which refuses
before any Python runs: what the paragraphs below found this door cannot do.

A Python gRPC server takes ("claims") the calls gRPC core has received one at a time on its event
loop; until then a call waits in gRPC core's queue, where nothing of inferd can count it. Under a
transport-bound load that queue is where all the waiting is: with 1,800 calls kept in flight on mlp
(issue 42), gRPC core held 1,800 calls while the worker's handlers held 0 to 3 of them and the core's
admission saw none; every call waited ~1 s there. The door counts what gRPC core holds too, from gRPC
core's own channelz counters of the port's calls (started minus ended: those in inferd's handlers and
those still in gRPC's queue), and refuses an inference call (ModelInfer) taken while the server holds
more than ``--grpc-max-held-calls``, with UNAVAILABLE and the reason, before it costs anything more
(no decoding, no hand-off).

Off by default (:data:`DEFAULT_MAX_HELD_CALLS` 0), as measured (bench/RESULTS.md, "door"): a call is
refused only once a handler takes it, and taking it is the transport-bound server's bottleneck (the
event loop claims one call per few turns; a refusal costs the process 0.55-0.8x what serving mlp does),
so refusing cannot shorten gRPC's queue, only answer what passes through it. Against clients that resend
a refused call at once (the issue's load: 1,800 kept in flight on mlp), the server keeps holding 1,800
calls whatever it answers, so every call taken is past a bound of 1,088 but the few read while the count
was stale: 2 frontend workers admitted 93 calls/s instead of 2,225 (2,806/s answered), at the same p99
(1.40 s against 1.32 s); one process 134/s instead of 2,027 (p99 0.69 s against 1.11 s). No rule at this
door meets the issue's 500 ms: the admitted calls wait for the whole queue ahead of them, 1,800 calls at
the 2,800-3,600 answers/s this machine's two cores make, whatever fraction is refused. A closed loop of
1,024 clients was never refused. Earlier (not in RESULTS.md) against clients that back off
(exponentially, from 50 ms), admitted calls waited about half as long (p99 0.76 s against 1.2 s) but
the server answered about a third as many. A server whose clients back off, and that would rather
bound its queue than serve every call, sets it: 1,088 (:data:`SUGGESTED_MAX_HELD_CALLS`) is past what a closed loop of 1,024 clients can hold
(1,024 calls and a few control calls beside), so such a benchmark is never refused. A door in front of
gRPC's queue needs a native front: gRPC core answers its own pending-call limit CANCELLED, while a
proxy's circuit breaker (Envoy's ``max_requests``, 1,024 by default, in front of the replicas
inferd/deploy/envoy.py configures) answers the excess 503 / UNAVAILABLE before any Python runs.

Reading channelz costs ~0.2 ms (gRPC core renders JSON), so the count is read only on a busy port:
when ``refresh_calls`` calls were taken since the last reading and ``refresh_s`` has passed; between
readings the calls waiting in gRPC's queue are taken as last read, less those taken since (gRPC hands
them over in order), and the calls in handlers are counted exactly (:meth:`Door.enter` /
:meth:`Door.leave`). A reading older than ``stale_s`` counts for nothing (the port went quiet). With
frontend workers, each worker's door writes its count into its slot of a shared
:class:`~inferd.ipc.tally.Tally` and adds the other workers' fresh counts, so the bound is the whole
server's whichever worker the kernel gave each connection.

:func:`held` and :func:`refused` are the decision as plain data; :class:`Door` is the thin driver a
:class:`~inferd.frontends.grpc_port.GrpcPort` calls on the loop.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from inferd.clock import Clock, MonotonicClock
from inferd.errors import Unavailable

if TYPE_CHECKING:  # a door is handed its tally; only a worker whose server bounds held calls makes one
    from inferd.ipc.tally import Tally

log = logging.getLogger(__name__)

# Off: the module says why. When asked for: 1,024 clients' calls and 64 control calls beside them.
DEFAULT_MAX_HELD_CALLS = 0
SUGGESTED_MAX_HELD_CALLS = 1024 + 64
REFRESH_S = 0.01
REFRESH_CALLS = 8
STALE_S = 0.5
FLAG = "--grpc-max-held-calls"
METHODS = ("ModelInfer",)  # what the door refuses; every call is counted


@dataclass(frozen=True, slots=True)
class DoorPolicy:
    """``bound``: calls the server may hold (0: no door); when gRPC core's count is read again."""

    bound: int = DEFAULT_MAX_HELD_CALLS
    refresh_s: float = REFRESH_S
    refresh_calls: int = REFRESH_CALLS
    stale_s: float = STALE_S

    def __post_init__(self) -> None:
        if self.bound < 0:
            raise ValueError(f"{FLAG} must be >= 0 (0: no bound), got {self.bound}")


def held(handlers: int, waiting: int, others: int) -> int:
    """The calls the server holds: in this port's handlers, in gRPC's queue at this port (as last
    read), and at the other processes' ports."""
    return handlers + waiting + others


def refused(policy: DoorPolicy, total: int) -> bool:
    """Whether a call taken while the server holds ``total`` calls (itself included) is refused."""
    return bool(policy.bound) and total > policy.bound


def should_read(policy: DoorPolicy, taken: int, read_at: float, now: float) -> bool:
    """Whether to read gRPC core's count again: a busy port (``taken`` calls since the last reading)
    and ``refresh_s`` since it."""
    return taken >= policy.refresh_calls and now - read_at >= policy.refresh_s


class Door:
    """One gRPC port's door, driven on its event loop.

    ``counter`` (set by the port once its server runs; None: gRPC core's count is not available) returns
    the calls gRPC core holds for the port; ``tally``/``slot``: the server's other ports' counts;
    ``on_refused``: each refusal, for the server's overload counter."""

    def __init__(self, policy: DoorPolicy | None = None, clock: Clock | None = None,
                 on_refused: Callable[[], None] | None = None, tally: Tally | None = None, slot: int = 0) -> None:
        self.policy = policy or DoorPolicy()
        self.clock = clock or MonotonicClock()
        self.on_refused = on_refused
        self.tally = tally
        self.slot = slot
        self.counter: Callable[[], int] | None = None
        self.handlers = 0  # calls inside this port's handlers now
        self.waiting = 0  # calls gRPC core held that no handler had taken, at the last reading
        self.read_at = float("-inf")
        self.taken = 0  # calls taken since the last reading
        self.refusals = 0

    @property
    def enabled(self) -> bool:
        return self.policy.bound > 0

    def enter(self) -> None:
        """A handler took a call (any method)."""
        self.handlers += 1
        self.taken += 1
        self._publish()

    def leave(self) -> None:
        """A handler is done with its call."""
        self.handlers -= 1
        self._publish()

    def _publish(self) -> None:
        """The other ports see this one's count at once (behind the gRPC front, calls reach the handlers
        with no queue in gRPC core to read, so the readings alone would leave the count stale)."""
        if self.tally is not None:
            self.tally.write(self.slot, self.handlers + self.waiting, round(self.clock.now() * 1e9))

    def read(self, now: float) -> None:
        """Read gRPC core's count of the calls this port holds; tell the other ports."""
        assert self.counter is not None
        total = self.counter()
        self.waiting = max(total - self.handlers, 0)
        self.read_at = now
        self.taken = 0
        if self.tally is not None:
            self.tally.write(self.slot, self.handlers + self.waiting, round(now * 1e9))

    def refusal(self, model: str) -> Unavailable | None:
        """The UNAVAILABLE that refuses an inference call just taken for ``model``, or None to let it in."""
        policy = self.policy
        if not policy.bound:
            return None
        now = self.clock.now()
        if self.counter is not None and should_read(policy, self.taken, self.read_at, now):
            self.read(now)
        # Every call taken since the reading left gRPC's queue (for a handler, counted in ``handlers``).
        waiting = max(self.waiting - self.taken, 0) if now - self.read_at <= policy.stale_s else 0
        others = self.tally.others(self.slot, round((now - policy.stale_s) * 1e9)) if self.tally is not None else 0
        total = held(self.handlers, waiting, others)
        if not refused(policy, total):
            return None
        self.refusals += 1
        if self.on_refused is not None:
            self.on_refused()
        where = f"{waiting} of them still in gRPC's queue, not yet taken by a handler"
        if others:
            where += f", {others} at the other frontend workers"
        return Unavailable(
            f"model '{model}': request refused: the server is overloaded: it already holds {total} gRPC calls "
            f"({where}), past {FLAG} {policy.bound}; retry later")


def channelz_counter(server_ids: set[int]) -> Callable[[], int] | None:
    """The count of calls gRPC core holds for the one server whose channelz id is new since
    ``server_ids`` were listed (:func:`channelz_servers`), or None when there is not exactly one
    (channelz off, or a gRPC without it)."""
    try:
        from grpc._cython import cygrpc
    except ImportError:  # pragma: no cover - every grpcio has it
        return None
    new = channelz_servers() - server_ids
    if len(new) != 1:
        log.info("gRPC's own count of the calls it holds is not available (%d new channelz servers); the door "
                 "counts the calls in inferd's handlers only", len(new))
        return None
    (server_id,) = new

    def count() -> int:
        data = json.loads(cygrpc.channelz_get_server(server_id))["server"]["data"]
        return int(data.get("callsStarted", 0)) - int(data.get("callsSucceeded", 0)) - int(data.get("callsFailed", 0))

    return count


def channelz_servers() -> set[int]:
    """The channelz ids of this process's gRPC servers (empty where channelz is not available)."""
    try:
        from grpc._cython import cygrpc

        listed = json.loads(cygrpc.channelz_get_servers(0))
    except Exception:  # noqa: BLE001 - a gRPC without channelz: the door counts its handlers only
        return set()
    return {int(s["ref"]["serverId"]) for s in listed.get("server", [])}
