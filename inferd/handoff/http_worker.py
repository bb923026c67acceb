"""A frontend worker's HTTP/REST app.

The inference route is the single-process one (``HttpFrontend.infer``: the same
decoding, encoding, compression and error words) over a worker-side data plane
that hands the decoded tensors to the core through the arenas. Every other
route is forwarded to the core as it arrived and answered by the core's own
HTTP app (:mod:`inferd.handoff.passthrough`). An inference request that names a
system shared memory region is forwarded whole as well: its tensors are in the
client's region, not in the body, and the regions are registered in the core.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferd.dtypes import BY_NAME
from inferd.handoff import wire
from inferd.handoff.core_codec import datatype_of
from inferd.handoff.link import WorkerLink
from inferd.types import InferenceRequest, InferenceResponse

_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


class _InSharedMemory(Exception):
    """The request names a shared memory region: the core, which holds the regions, decodes it."""


class _SharedMemoryProbe:
    def ref(self, params: dict[str, Any], where: str) -> None:
        if any(k in params for k in _SHM_KEYS):
            raise _InSharedMemory()
        return None


class _Carrier:
    """What ``tracing.start`` gives in a worker: the headers that go to the core, which traces."""

    __slots__ = ("carrier",)

    def __init__(self, carrier: dict[str, Any]) -> None:
        self.carrier = carrier


class _Tracing:
    def __init__(self, link: WorkerLink) -> None:
        self._link = link

    @property
    def enabled(self) -> bool:
        return self._link.tracing

    def start(self, model: str, request_id: str, carrier: Any = None) -> _Carrier:
        headers = dict(carrier()) if carrier is not None else {}
        headers["t0"] = time.time_ns()
        return _Carrier(headers)


class WorkerDataPlane:
    """The part of the data plane the HTTP inference route calls, over the hand-off."""

    def __init__(self, link: WorkerLink) -> None:
        self.link = link
        self.shared_memory = _SharedMemoryProbe()
        self.tracing = _Tracing(link)

    def refuse_if_draining(self) -> None:
        self.link.refuse_if_draining()

    async def infer(self, request: InferenceRequest, decoupled_error: str = "") -> InferenceResponse:
        from inferd.server.codec import decode_bytes, encode_bytes

        link = self.link
        pending = link.pending
        tensors, parts = [], []
        for name, array in request.inputs.items():
            datatype = datatype_of(array)
            data = encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
            tensors.append([name, datatype, list(array.shape), None, len(data), None])
            parts.append(data)
        block = wire.NO_BLOCK
        if parts:
            block, offsets = link.inputs.put(parts)
            for t, offset in zip(tensors, offsets):
                t[wire.T_OFFSET] = offset
        outputs = None
        if request.requested_outputs is not None:
            outputs = [[r.name, r.parameters or None] for r in request.requested_outputs]
        trace = request.trace.carrier if request.trace is not None else None
        rid = pending.next_rid()
        message = [wire.INFER, rid, request.model_name, str(request.model_version or ""), request.id,
                   request.parameters or None, tensors, outputs, wire.HTTP, request.deadline, trace]
        fut = pending.unary(rid, message, block)
        try:
            reply = await fut
        except asyncio.CancelledError:
            pending.cancel(rid)
            raise
        arrays = {}
        for name, datatype, shape, offset, nbytes in reply[wire.R_OUTPUTS]:
            dtype = BY_NAME[datatype]
            count = int(np.prod(shape)) if shape else 1
            if datatype == "BYTES":  # (never in shared memory here: such requests are forwarded whole)
                arrays[name] = decode_bytes(link.outputs.read(offset, nbytes), count, name).reshape(shape)
            else:
                arrays[name] = link.outputs.array(dtype.numpy, offset, count).reshape(shape).copy()
        pending.release(reply[wire.R_BLOCK])
        return InferenceResponse(model_name=reply[wire.R_MODEL], model_version=reply[wire.R_VERSION],
                                 outputs=arrays, id=reply[wire.R_ID], parameters=reply[wire.R_PARAMS] or {})


def worker_app(link: WorkerLink) -> Starlette:
    from inferd.server.http_service import HttpFrontend, error_response

    frontend = HttpFrontend(WorkerDataPlane(link))  # type: ignore[arg-type]

    async def forward(request: Request) -> Response:
        try:
            status, headers, body = await link.call(
                "http", request.method, request.url.path, request.scope.get("query_string", b""),
                list(request.scope["headers"]), await request.body())
        except Exception as exc:
            return error_response(exc)
        response = Response(body, status_code=status)
        response.raw_headers = headers
        return response

    async def infer(request: Request) -> Response:
        try:
            return await frontend.infer(request)
        except _InSharedMemory:
            return await forward(request)
        except Exception as exc:
            return error_response(exc)

    routes = [Route("/v2/models/{model}/infer", infer, methods=["POST"]),
              Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
              Route("/{path:path}", forward, methods=_METHODS)]
    return Starlette(routes=routes)
