"""A frontend worker's gRPC services.

``inference.GRPCInferenceService``: ModelInfer and ModelStreamInfer hand their
tensors to the core through the arenas (:mod:`inferd.handoff.grpc_codec`);
every other method is forwarded as it arrived, undecoded bytes, to the core,
which runs the single-process servicer on it and sends back the encoded answer
(:mod:`inferd.handoff.passthrough`): metadata, config, statistics, repository
control, shared memory, trace and log settings are answered by the one copy of
that state, whichever frontend a client reached.

``grpc.health.v1.Health`` answers from the status the core pushes (STATE), and
Watch streams wake on each push; server reflection is served locally.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferd._proto import grpc_service_pb2 as pb
from inferd.errors import InferdError, grpc_status
from inferd.handoff import wire
from inferd.handoff.grpc_codec import fill_response, infer_message
from inferd.handoff.link import WorkerLink
from inferd.handoff.pending import error_from

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
EMPTY_FINAL = "triton_enable_empty_final_response"  # a stream request's parameter
FINAL_RESPONSE = "triton_final_response"  # then set on every response of the stream
_LOCAL = {"ModelInfer", "ModelStreamInfer"}


def _metadata(context: Any) -> dict[str, str]:
    return {m.key: m.value for m in context.invocation_metadata() or () if isinstance(m.value, str)}


class WorkerServicer:
    def __init__(self, link: WorkerLink) -> None:
        self.link = link
        self.pending = link.pending

    def _carrier(self, context: Any) -> dict[str, Any]:
        carrier: dict[str, Any] = _metadata(context)
        carrier["t0"] = time.time_ns()  # the request span starts here, in the frontend
        return carrier

    # -- inference ------------------------------------------------------------------

    async def model_infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        link = self.link
        pending = self.pending
        try:
            link.refuse_if_draining()
            rid = pending.next_rid()
            remaining = context.time_remaining()
            block, message = infer_message(
                rid, request, link.inputs, 0, None if remaining is None else time.monotonic() + remaining,
                self._carrier(context) if link.tracing else None)
            fut = pending.unary(rid, message, block)
        except InferdError as exc:
            return await context.abort(*grpc_status(exc))
        try:
            reply = await fut
        except asyncio.CancelledError:
            pending.cancel(rid)
            raise
        except InferdError as exc:
            return await context.abort(*grpc_status(exc))
        response = pb.ModelInferResponse()
        fill_response(response, reply, link.outputs)
        pending.release(reply[wire.R_BLOCK])
        return response

    async def model_stream_infer(self, request_iterator: Any, context: Any):  # type: ignore[no-untyped-def]
        """As the single-process servicer: each request runs as it arrives, its responses are
        written as they come, and a failed request answers with ``error_message``."""
        out: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()
        finished = object()
        pending = 1
        carrier = self._carrier(context) if self.link.tracing else None

        async def run(msg: pb.ModelInferRequest) -> None:
            try:
                async for message in self._stream_one(msg, carrier):
                    out.put_nowait(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                out.put_nowait(_stream_error(msg, exc))
            finally:
                out.put_nowait(finished)

        async def read() -> None:
            nonlocal pending
            try:
                async for msg in request_iterator:
                    pending += 1
                    task = asyncio.ensure_future(run(msg))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                out.put_nowait(finished)

        reader = asyncio.ensure_future(read())
        try:
            while pending:
                message = await out.get()
                if message is finished:
                    pending -= 1
                    continue
                yield message
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _stream_one(self, msg: pb.ModelInferRequest, carrier: dict | None):  # type: ignore[no-untyped-def]
        link = self.link
        link.refuse_if_draining()
        pending = self.pending
        rid = pending.next_rid()
        block, message = infer_message(rid, msg, link.inputs, wire.STREAM, None, carrier)
        params = message[wire.I_PARAMS]
        flagged = bool(params) and params.pop(EMPTY_FINAL, False) is True
        stream = pending.stream(rid, message, block)
        done = False
        try:
            while not done:
                item = await stream.queue.get()
                if isinstance(item, InferdError):  # the core went away
                    yield _stream_error(msg, item)
                    return
                kind = item[0]
                done = kind == wire.FINAL or item[2]
                if kind == wire.RESPONSE:
                    out = pb.ModelStreamInferResponse()
                    fill_response(out.infer_response, item, link.outputs)
                    pending.release(item[wire.R_BLOCK])
                elif kind == wire.ERROR:
                    out = _stream_error(msg, error_from(item[3], item[4]))
                elif flagged:
                    out = pb.ModelStreamInferResponse()
                    r = out.infer_response
                    r.model_name, r.model_version, r.id = msg.model_name, msg.model_version, msg.id
                else:
                    continue
                if flagged:
                    out.infer_response.parameters[FINAL_RESPONSE].bool_param = done
                yield out
        finally:
            if not done:
                pending.cancel(rid)

    # -- everything else: forwarded ------------------------------------------------------

    def forward(self, method: str):  # type: ignore[no-untyped-def]
        link = self.link

        async def call(request: bytes, context: Any) -> bytes:
            try:
                ok, *answer = await link.call("grpc", method, request)
            except InferdError as exc:
                return await context.abort(*grpc_status(exc))
            if ok:
                return answer[0]
            code, details = answer
            return await context.abort(grpc.StatusCode[code], details)

        return call

    def add_to_server(self, server: grpc.aio.Server) -> None:
        service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in service.methods:
            if method.name not in _LOCAL:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(self.forward(method.name))
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
            self.model_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelStreamInferResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)


def _stream_error(msg: Any, exc: BaseException) -> pb.ModelStreamInferResponse:
    _, message = grpc_status(exc)
    if not isinstance(exc, InferdError):
        log.exception("unexpected error in a stream request", exc_info=exc)
    response = pb.ModelStreamInferResponse(error_message=message)
    r = response.infer_response
    r.model_name, r.model_version, r.id = msg.model_name, msg.model_version, msg.id
    return response


class WorkerHealth(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 from the core's pushed status; NOT_SERVING from the moment this worker drains."""

    def __init__(self, link: WorkerLink) -> None:
        self.link = link
        self.closed = False

    def status(self, service: str) -> int | None:
        if service not in self.link.health:
            return None
        if self.link.draining or self.link.core_gone:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return self.link.health[service]

    async def Check(self, request, context):  # type: ignore[no-untyped-def]
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):  # type: ignore[no-untyped-def]
        last = None
        while True:
            changed = self.link.state_changed
            status = self.status(request.service)
            status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self.closed:
                return
            await changed.wait()

    def close(self) -> None:
        """The port is closing: wake every Watch so it ends its stream."""
        self.closed = True
        self.link.update_state({})
