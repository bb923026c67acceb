"""``inferd serve --frontend-workers N``: this process is the core, N workers own the wire.

The core loads the models, runs the data plane, schedulers, ensembles, sequences
and Python models exactly as one process does, serves ``/metrics`` (the one
copy of every statistic), and reserves the gRPC and HTTP ports; the workers
(:mod:`inferd.serve.worker_process`) serve those ports with SO_REUSEPORT and call the
core's data plane through their proxies. Start-up: metrics port, port
reservations, workers (live, not ready), then the models. Stop (SIGTERM/SIGINT):
every worker drains first (readiness false, new requests refused, the accepted
ones answered by the core, ports closed, exit); then the core stops as the
one-process server does, with nothing left in flight from outside.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from inferd.handoff.messages import CALLS, State
from inferd.handoff.core.endpoint import DataPlaneEndpoint
from inferd.ipc.tally import Tally
from inferd.serve.recycling import RecyclePolicy
from inferd.serve.supervisor import Supervisor, WorkerProcess, reserve
from inferd.serve.one_process import InferenceServer, ServerOptions

log = logging.getLogger("inferd")


class MultiProcessServer(InferenceServer):
    def __init__(self, options: ServerOptions, workers: int, recycle: RecyclePolicy | None = None) -> None:
        super().__init__(options)
        self.workers = workers
        self.recycle = recycle or RecyclePolicy()  # a worker past its memory bound is replaced (issue 42)
        self.supervisor: Supervisor | None = None
        self._reserved: list[socket.socket] = []
        self._grpc_port = 0
        self._http_port = 0
        self._tracing_sent: bool | None = None
        # The gRPC door's counts, one slot per worker, so each bounds the calls of the whole server.
        self.door_tally: Tally | None = None

    @property
    def grpc_port(self) -> int:  # type: ignore[override]
        return self._grpc_port

    @property
    def http_port(self) -> int:  # type: ignore[override]
        return self._http_port

    async def _open_ports(self) -> None:
        o = self.options
        if o.allow_metrics:
            await self._start_metrics()
        if o.allow_grpc:
            sock = reserve(o.address, o.grpc_port, "gRPC")
            if o.behind_front:
                self._front_port = sock  # Envoy's, released once it stopped
            else:
                self._reserved.append(sock)
            self._grpc_port = sock.getsockname()[1]
        if o.allow_http:
            sock = reserve(self.http_address, o.http_port, "HTTP")
            self._reserved.append(sock)
            self._http_port = sock.getsockname()[1]
        if o.allow_grpc and o.grpc_door_bound:
            self.door_tally = Tally.create(self.workers, "inferd-door")
        shared = (self.door_tally.fd,) if self.door_tally is not None else ()
        self.supervisor = Supervisor(self.workers, self._worker_config, self._endpoint, shared_fds=shared,
                                     recycle=self.recycle, grace=o.grace_seconds)
        if o.behind_front:
            self.spawn_front([self.front_sockets(i) for i in range(self.workers)])
        await self.supervisor.start()  # a failure stops the server, Envoy with it
        await self.front_serving()
        log.info("%d frontend workers serving%s%s", self.workers,
                 f" gRPC on {o.address}:{self.grpc_port}{' through Envoy' if self.front else ''}"
                 if o.allow_grpc else "",
                 f" HTTP on {self.http_address}:{self.http_port}" if o.allow_http else "")

    def _worker_config(self, index: int) -> dict[str, Any]:
        o = self.options
        self._tracing_sent = self.dataplane.tracing.enabled
        return {
            "index": index,
            # Every worker's ports are built as the one-process server's (GrpcPort, HttpFrontend): the
            # same limits, TLS and restricted groups, as plain data.
            "grpc": {"address": o.address, "port": self.grpc_port, "max_message_bytes": o.max_message_bytes,
                     "options": [list(kv) for kv in o.grpc_options],
                     "tls": o.grpc_tls.to_plain() if o.grpc_tls else None,
                     "restrictions": o.grpc_restrictions.to_plain(),
                     "header_forward_pattern": o.grpc_header_forward_pattern,
                     "door": {"bound": o.grpc_door_bound, "slot": index,
                              "tally": [self.door_tally.fd, self.door_tally.slots] if self.door_tally else None},
                     "front": self.front_sockets(index).to_plain() if o.behind_front else None,
                     } if o.allow_grpc else None,
            "http": {"address": self.http_address, "port": self.http_port, "max_input_bytes": o.http_max_input_bytes,
                     "tls": o.http_tls.to_plain() if o.http_tls else None,
                     "restrictions": o.http_restrictions.to_plain(),
                     "openai": o.openai.to_plain(),
                     "header_forward_pattern": o.http_header_forward_pattern} if o.allow_http else None,
            "state": {"tracing": self._tracing_sent},
            # A worker holds at most what the whole server may (the core's admission bounds their sum). Not
            # a share of it: the kernel spreads connections, not calls, so one worker can carry a client's
            # whole closed loop (perf_analyzer at concurrency 1,024 over a few connections; issue 42).
            "max_pending": o.max_queued_requests,
            "max_queued_requests": o.max_queued_requests,
            "grace": o.grace_seconds,  # a worker's own SIGTERM drains with the server's grace
            "log_level": logging.getLogger().level,
        }

    async def _drained_then_front_drained(self, deadline: float) -> None:
        """Once the workers' requests are answered (or the wait for them ends), Envoy stops taking
        connections and drains its own, before the workers close the sockets it sends to (each worker ends
        its streams as its requests are answered); Envoy itself stops last (InferenceServer.stop)."""
        try:
            await self.dataplane.drained()
        finally:
            if self.front is not None:
                await asyncio.shield(self.drain_front(deadline))

    def child_pids(self) -> list[int]:
        return (self.supervisor.pids() if self.supervisor is not None else []) + super().child_pids()

    def _endpoint(self, worker: WorkerProcess) -> DataPlaneEndpoint:
        return DataPlaneEndpoint(worker, self.dataplane, self._call)

    async def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        """A worker's proxy calling the data plane's façade, or its /v1 routes calling OpenAI's Batch API
        (the core's batches, which the data plane implements)."""
        if method not in CALLS:
            raise ValueError(f"'{method}' is not a data plane call")
        result = await getattr(self.dataplane, method)(*args, **kwargs)
        if self.dataplane.tracing.enabled != self._tracing_sent:  # a trace setting turned it on or off
            self._tracing_sent = self.dataplane.tracing.enabled
            for worker in self.supervisor.workers.values() if self.supervisor else ():
                worker.channel.send(State(tracing=self._tracing_sent))
        return result

    async def stop(self, grace: float | None = None) -> None:
        """Drain every worker (each answers what it accepted), then stop the core; the whole
        stop waits for requests ``grace`` seconds (the options' by default) in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.options.grace_seconds if grace is None else grace)
        if self.supervisor is not None:
            self.dataplane.drain()  # not ready and refusing at once, through every worker
            # Batch lines (OpenAI's run through the data plane) are not requests to wait for: they stop
            # first, to resume at the next start.
            await self.dataplane.stop_batches()
            await self.supervisor.stop(max(deadline - loop.time(), 0.0), self._drained_then_front_drained(deadline))
        for sock in self._reserved:
            sock.close()
        self._reserved.clear()
        if self.door_tally is not None:
            self.door_tally.close()
            self.door_tally = None
        await super().stop(max(deadline - loop.time(), 0.0))
