"""A frontend worker's gRPC servicer: the single-process one, with ModelInfer handed off directly.

Every method but ModelInfer is :class:`InferenceServicer`'s own, over the
worker's :class:`~inferd.handoff.proxy.RemoteDataPlane`. ModelInfer, the hot
path, goes from the protobuf request straight to an INFER message: each
``raw_input_contents`` entry is copied once into the input block and the core
decodes and validates it there; no numpy array, InferenceRequest or
InferenceResponse is built in the worker (:mod:`inferd.handoff.grpc_codec`).
"""

from __future__ import annotations

import asyncio
import time

from inferd._proto import grpc_service_pb2 as pb
from inferd.errors import InferdError
from inferd.handoff import wire
from inferd.handoff.grpc_codec import fill_response, infer_message
from inferd.handoff.link import WorkerLink
from inferd.handoff.proxy import RemoteDataPlane
from inferd.server.grpc_service import InferenceServicer, _metadata
from inferd.server.status import grpc_status


class WorkerServicer(InferenceServicer):
    def __init__(self, link: WorkerLink) -> None:
        super().__init__(RemoteDataPlane(link))
        self.link = link
        self.pending = link.pending

    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        received_ns = time.monotonic_ns()  # the whole wait counts from here, in the core too
        link = self.link
        pending = self.pending
        try:
            link.refuse_if_draining()
            link.refuse_if_full(request.model_name)
            rid = pending.next_rid()
            remaining = context.time_remaining()
            trace = _metadata(context) if link.tracing else None  # the W3C context, for the core's spans
            block, message = infer_message(
                rid, request, link.inputs, 0, None if remaining is None else time.monotonic() + remaining, trace,
                received_ns)
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
        pending.release(reply)
        return response
