"""The data plane as a frontend worker sees it: the façade over the hand-off.

The worker runs the single-process frontends' own code (the gRPC servicer, the
HTTP app, gRPC health) over :class:`RemoteDataPlane`, so every RPC and route
behaves as in one process. Control-plane methods are calls answered by the core's
data plane (arguments and results pickled: plain data, between our own two
processes, never per inference). :meth:`RemoteDataPlane.infer` and
:meth:`~RemoteDataPlane.infer_stream` send the request's tensors through the
input arena and read the answers' from the output arena.

gRPC ModelInfer, the hot path, skips even the numpy decoding:
:meth:`RemoteDataPlane.grpc_infer` (the façade's
:class:`~inferd.facade.GrpcFastPath`, which the servicer takes when its data
plane offers it) goes from the protobuf request straight to an Infer message:
each ``raw_input_contents`` entry is copied once into the input block and the
core decodes and validates it there; no numpy array, InferenceRequest or
InferenceResponse is built in the worker (:mod:`inferd.handoff.worker.modelinfer`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

import numpy as np

from inferd._proto import grpc_service_pb2 as pb
from inferd.dtypes import BY_NAME, decode_bytes, encode_bytes
from inferd.errors import InferdError
from inferd.facade import (
    DECOUPLED_UNARY, CudaRegionStatus, IndexEntry, ModelMetadata, RegionStatus, ServerMetadata, TraceCarrier,
)
from inferd.handoff.messages import (
    CREDIT_EVERY, HTTP, NOT_IN_ARENA, STREAM, Error, Infer, InputTensor, OutputRequest, Response, datatype_of,
)
from inferd.handoff.worker.core_link import CoreLink, error_from
from inferd.handoff.worker.modelinfer import fill_response, infer_message
from inferd.ipc.arena import Buffer
from inferd.facade import OpenAIModel
from inferd.streaming import StreamResponse
from inferd.types import InferenceRequest, InferenceResponse, SharedTensor

if TYPE_CHECKING:  # unpickling the core's statistics reply imports it, the first time one comes
    from inferd.observability.stats import ModelStatistics


class RemoteDataPlane:
    """:class:`~inferd.facade.DataPlaneAPI` and :class:`~inferd.facade.GrpcFastPath` over the worker's link."""

    def __init__(self, link: CoreLink) -> None:
        self.link = link

    # -- the control plane: the core answers ----------------------------------------------

    async def server_live(self) -> bool:
        return await self.link.call("server_live")

    async def server_ready(self) -> bool:
        if self.link.draining:  # this worker takes no more requests, whatever the core says yet
            return False
        return await self.link.call("server_ready")

    async def model_ready(self, name: str, version: int = 0) -> bool:
        if self.link.draining:
            return False
        return await self.link.call("model_ready", name, version)

    async def server_metadata(self) -> ServerMetadata:
        return await self.link.call("server_metadata")

    async def model_metadata(self, name: str, version: int = 0) -> ModelMetadata:
        return await self.link.call("model_metadata", name, version)

    async def model_config(self, name: str, version: int = 0) -> Any:
        return await self.link.call("model_config", name, version)

    async def model_statistics(self, name: str = "", version: int = 0) -> list[ModelStatistics]:
        return await self.link.call("model_statistics", name, version)

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return await self.link.call("repository_index", ready_only)

    async def openai_models(self, name: str = "", assets: bool = False) -> list[OpenAIModel]:
        return await self.link.call("openai_models", name, assets)

    async def load_model(self, name: str, parameters: Mapping[str, object] | None = None,
                         repository: str = "") -> None:
        await self.link.call("load_model", name, dict(parameters or {}), repository)

    async def unload_model(self, name: str, parameters: Mapping[str, object] | None = None,
                           repository: str = "") -> None:
        await self.link.call("unload_model", name, dict(parameters or {}), repository)

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self.link.call("shm_register", name, key, offset, byte_size)

    async def shm_status(self, name: str = "") -> list[RegionStatus]:
        return await self.link.call("shm_status", name)

    async def shm_unregister(self, name: str = "") -> None:
        await self.link.call("shm_unregister", name)

    async def cuda_shm_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        await self.link.call("cuda_shm_register", name, raw_handle, device_id, byte_size)

    async def cuda_shm_status(self, name: str = "") -> list[CudaRegionStatus]:
        return await self.link.call("cuda_shm_status", name)

    async def cuda_shm_unregister(self, name: str = "") -> None:
        await self.link.call("cuda_shm_unregister", name)

    async def trace_settings(self, model: str = "",
                             changes: Mapping[str, list[str]] | None = None) -> dict[str, list[str]]:
        return await self.link.call("trace_settings", model, dict(changes) if changes else None)

    async def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await self.link.call("log_settings", dict(changes) if changes else None)

    async def kv_cache_blocks(self) -> dict[str, float]:
        return await self.link.call("kv_cache_blocks")

    # Batch jobs run in the core (their state on its disk); a JSONL file travels once, as bytes.
    async def batch_submit(self, data: bytes, model: str, version: int = 0) -> dict[str, Any]:
        return await self.link.call("batch_submit", data, model, version)

    async def batch_list(self) -> list[dict[str, Any]]:
        return await self.link.call("batch_list")

    async def batch_status(self, job_id: str) -> dict[str, Any]:
        return await self.link.call("batch_status", job_id)

    async def batch_cancel(self, job_id: str) -> dict[str, Any]:
        return await self.link.call("batch_cancel", job_id)

    async def batch_results(self, job_id: str, fmt: str = "jsonl") -> bytes:
        return await self.link.call("batch_results", job_id, fmt)

    # -- inference: tensors through the arenas ---------------------------------------------

    def _send(self, request: InferenceRequest, flags: int,
              trace_carrier: TraceCarrier | None) -> tuple[int, Infer]:
        """(input block, Infer) for ``request`` (the caller sends it through InFlight)."""
        link = self.link
        link.refuse_if_draining()
        link.refuse_if_full(request.model_name)
        tensors: list[InputTensor] = []
        placed: list[InputTensor] = []
        parts: list[Buffer] = []
        for name, array in request.inputs.items():
            if isinstance(array, SharedTensor):
                ref = array.ref
                tensors.append(InputTensor(name, array.datatype.name, list(array.shape), NOT_IN_ARENA, 0,
                                           {"shared_memory_region": ref.region, "shared_memory_offset": ref.offset,
                                            "shared_memory_byte_size": ref.byte_size}))
                continue
            datatype = datatype_of(array)
            data = encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            tensor = InputTensor(name, datatype, list(array.shape), NOT_IN_ARENA, len(data), None)  # placed below
            tensors.append(tensor)
            placed.append(tensor)
            parts.append(data)
        outputs = None
        if request.requested_outputs is not None:
            outputs = [OutputRequest(r.name, r.parameters or None) for r in request.requested_outputs]
        stamps = request.frontend
        block, message = link.infer(
            request.model_name, str(request.model_version or ""), request.id, request.parameters or None, tensors,
            outputs, flags, request.deadline, request.received_ns or time.monotonic_ns(), request.openai_prompt_tokens,
            trace_carrier, placed, parts, "" if stamps is None else stamps.protocol,
            0 if stamps is None else stamps.recv_end_ns)
        if message.frontend is not None:  # the core may trace it: it learns when the answer was sent
            in_flight, rid = link.in_flight, message.rid
            stamps.on_sent = lambda start, end: in_flight.sent(rid, start, end)  # type: ignore[union-attr]
        return block, message

    def _response(self, reply: Response) -> InferenceResponse:
        """An InferenceResponse that owns its arrays (copied out), the output block released."""
        outputs = self.link.outputs
        arrays: dict[str, np.ndarray] = {}
        for o in reply.outputs:
            name, datatype, shape = o.name, o.datatype, o.shape
            dtype = BY_NAME[datatype]
            count = int(np.prod(shape)) if shape else 1
            if o.offset == NOT_IN_ARENA:  # written to the client's region: shape and type only
                arrays[name] = np.empty(shape, dtype=dtype.numpy if dtype.numpy is not None else np.object_)
            elif datatype == "BYTES" or dtype.numpy is None:
                arrays[name] = decode_bytes(outputs.read(o.offset, o.nbytes), count, name).reshape(shape)
            else:
                arrays[name] = outputs.array(dtype.numpy, o.offset, count).reshape(shape).copy()
        self.link.in_flight.release(reply)
        return InferenceResponse(model_name=reply.model, model_version=reply.version, outputs=arrays, id=reply.id,
                                 parameters=reply.parameters or {})

    def tracing_on(self) -> bool:
        return self.link.tracing  # the core's, pushed in STATE messages

    async def infer(self, request: InferenceRequest, decoupled_error: str = DECOUPLED_UNARY,
                    trace_carrier: TraceCarrier | None = None) -> InferenceResponse:
        flags = 0 if decoupled_error == DECOUPLED_UNARY else HTTP
        block, message = self._send(request, flags, trace_carrier)
        in_flight = self.link.in_flight
        fut = in_flight.unary(message, block)
        try:
            reply = await fut
        except asyncio.CancelledError:
            in_flight.cancel(message.rid)
            raise
        return self._response(reply)

    async def grpc_infer(self, message: Any, deadline: float | None, trace_carrier: TraceCarrier | None,
                         received_ns: int) -> Any:
        link = self.link
        in_flight = link.in_flight
        link.refuse_if_draining()
        link.refuse_if_full(message.model_name)
        block, infer = infer_message(link, message, deadline, trace_carrier, received_ns)
        rid = infer.rid
        traced = infer.frontend is not None  # Triton's GRPC_* trace timestamps: the core may sample it
        fut = in_flight.unary(infer, block)
        send_ns: int | None = None
        try:
            reply = await fut
            send_ns = time.monotonic_ns()
            response = pb.ModelInferResponse()
            fill_response(response, reply, link.outputs)
            in_flight.release(reply)
        except asyncio.CancelledError:
            in_flight.cancel(rid)
            if traced:
                in_flight.sent(rid, None, None)  # never answered: the trace ends without a send
                traced = False
            raise
        finally:
            if traced:  # an error is stamped as it leaves for the servicer's abort
                in_flight.sent(rid, send_ns or time.monotonic_ns(), time.monotonic_ns())
        return response

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        try:
            block, message = self._send(request, STREAM, None)
            stream = self.link.in_flight.stream(message, block)
        except InferdError as exc:
            yield StreamResponse(error=exc, final=True)
            return
        rid = message.rid
        done = False
        taken = 0  # responses the client took since the last credit sent back
        try:
            while not done:
                item = await stream.queue.get()
                if isinstance(item, InferdError):  # the core went away
                    done = True
                    yield StreamResponse(error=item, final=True)
                    return
                done = item.final
                if type(item) is Response:
                    yield StreamResponse(response=self._response(item), final=done)
                elif type(item) is Error:
                    yield StreamResponse(error=error_from(item.kind, item.message), final=done)
                else:
                    yield StreamResponse(final=True)
                # Back here: the client asked for the next one (the frontend wrote this one).
                taken += 1
                if taken >= CREDIT_EVERY and not done:
                    self.link.in_flight.credit(rid, taken)
                    taken = 0
        finally:
            if not done:
                self.link.in_flight.cancel(rid, request.ended_by_client)
