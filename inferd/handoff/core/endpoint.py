"""The core's endpoint for one frontend worker: Infer in, Response out, calls answered.

The codec of the core's side is here too: an Infer's input tensors become
numpy arrays *in place* in the worker's input arena (read-only views: the
bytes were written once, by the worker, and are never copied again unless a
model keeps them); a response's outputs are written once into the worker's
output arena, in one block per response.

Every request a frontend sends gets exactly one final message back (Response or
Error with ``final`` set, or Final after a decoupled model's last response),
whatever happens to it: that message is what frees the request's input block in
the frontend, so the core never sends it while it may still read the inputs.
A Cancel (the client went away) cancels the request: a queued request is
dropped before it costs compute, and the final message still follows.

A one-response request takes the model path with a callback
(:meth:`DataPlane.submit`): no task or coroutine per request, and the Infers
of one socket read are handed to the batcher together (``more``), so they can
share a batch; the response is encoded and queued as its batch ends. Stream
requests run as tasks over ``infer_stream``.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from contextlib import aclosing
from functools import partial
from typing import Any, Callable, Protocol

import numpy as np

from inferd.dtypes import encode_bytes
from inferd.errors import InferdError, InvalidArgument
from inferd.facade import DECOUPLED_HTTP, DECOUPLED_UNARY
from inferd.frontends import grpc_codec
from inferd.handoff.messages import (
    HTTP, NO_BLOCK, NOT_IN_ARENA, STREAM, STREAM_WINDOW, Call, Cancel, Credit, Error, Final, Free, Infer,
    OutputTensor, Refused, Reply, Response, Sent, ToCore, ToWorker, datatype_of,
)
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.channel import Channel
from inferd.model import ModelRun
from inferd.types import FrontendStamps, InferenceRequest, RequestedOutput, SharedTensor

log = logging.getLogger(__name__)
CANCELLED = "the request was cancelled"  # the final answer to a Cancel: the worker's client has gone


# -- the core's codec: Infer -> InferenceRequest, outputs -> Response ------------------------------

def request_from(msg: Infer, inputs: Arena) -> InferenceRequest:
    """The request an Infer message carries. Tensors in a client's system shared memory stay
    references (SharedTensor inputs, ShmRef outputs), resolved by the data plane."""
    model = msg.model
    arrays: dict[str, Any] = {}
    shared = False
    for t in msg.inputs:
        name = t.name
        where = f"input '{name}' for model '{model}'"
        dtype, dims = grpc_codec.tensor_type(t.datatype, t.shape, where)
        if name in arrays:
            raise InvalidArgument(f"{where}: the input is given twice")
        offset = t.offset
        if offset == NOT_IN_ARENA:
            ref = grpc_codec.shm_ref(t.parameters, where)
            if ref is None:
                raise InvalidArgument(f"{where}: no data: neither in the request nor in shared memory")
            arrays[name] = SharedTensor(ref, dtype, dims)
            shared = True
        else:
            count = 1
            for d in dims:
                count *= d
            nbytes = t.nbytes
            if dtype.name == "BYTES" or dtype.numpy is None or nbytes != count * dtype.itemsize:
                # BYTES (decoded from its framing), or a size or type the one-process codec refuses, in its words
                arrays[name] = grpc_codec.array_from_raw(inputs.view(offset, nbytes), dtype, dims, where)  # type: ignore[arg-type]
            else:
                arrays[name] = inputs.array(dtype.numpy, offset, count).reshape(dims)
    request = InferenceRequest(model_name=model, inputs=arrays,
                               model_version=grpc_codec.parse_version(model, msg.version),
                               id=msg.id, deadline=msg.deadline, shared_memory=shared,
                               received_ns=msg.received, openai_prompt_tokens=msg.openai_prompt_tokens)
    frontend = msg.frontend
    if frontend is not None:  # tracing is on: the frontend's receive stamps (it sends Sent later)
        request.frontend = FrontendStamps(frontend.protocol, msg.received, frontend.decoded_ns)
    params = msg.parameters
    if params:
        request.parameters = params
        request.priority = grpc_codec.int_param(model, params, "priority")
        request.timeout_us = grpc_codec.int_param(model, params, "timeout")
    outputs = msg.outputs
    if outputs is not None:
        requested = []
        for o in outputs:
            r = RequestedOutput(o.name)
            oparams = o.parameters
            if oparams:
                r.parameters = oparams
                r.class_count = grpc_codec.int_param(model, oparams, "classification")
                r.shared_memory = grpc_codec.shm_ref(oparams, f"output '{o.name}' for model '{model}'")
                if r.shared_memory is not None:
                    request.shared_memory = True
            requested.append(r)
        request.requested_outputs = requested
    return request


def response_message(rid: int, final: bool, response: Any, requested: list[RequestedOutput] | None,
                     outputs: ArenaWriter) -> Response:
    """A Response for an InferenceResponse; its tensors go into one new output block.
    Outputs requested into shared memory were written there already: they carry no data."""
    entries, block = _outputs_message(response.outputs, requested, outputs)
    # Positional, in the struct's field order: a few hundred instructions less than keywords, per response.
    return Response(rid, final, response.model_name, response.model_version, response.id, entries,
                    response.parameters or None, block)


def run_message(rid: int, run: Any, outputs: ArenaWriter) -> Response:
    """The final Response for a finished :class:`~inferd.model.ModelRun`."""
    request = run.request
    entries, block = _outputs_message(run.outputs, request.requested_outputs, outputs)
    model = run.model
    # Positional, in the struct's field order (rid, final, model, version, id, outputs, parameters, block).
    return Response(rid, True, model.spec.name, model.version, request.id, entries, None, block)


def _outputs_message(arrays: dict[str, np.ndarray], requested: list[RequestedOutput] | None,
                     outputs: ArenaWriter) -> tuple[list[OutputTensor], int]:
    in_shm = {r.name for r in requested if r.shared_memory is not None} if requested else None
    entries: list[OutputTensor] = []
    placed: list[OutputTensor] = []  # those whose bytes go into the block, in the order of parts
    parts: list[Any] = []
    for name, array in arrays.items():
        datatype = datatype_of(array)
        if in_shm and name in in_shm:
            entries.append(OutputTensor(name, datatype, list(array.shape), NOT_IN_ARENA, 0))
            continue
        if datatype == "BYTES":
            data: Any = encode_bytes(array)
        else:
            # A flat uint8 view: numpy dtypes the buffer protocol cannot name (bfloat16) still copy.
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        entry = OutputTensor(name, datatype, list(array.shape), NOT_IN_ARENA, len(data))  # placed below
        entries.append(entry)
        placed.append(entry)
        parts.append(data)
    block = NO_BLOCK
    if parts:
        block, offsets = outputs.put(parts)
        for entry, offset in zip(placed, offsets):
            entry.offset = offset
    return entries, block


def failure(rid: int, exc: BaseException, final: bool = True) -> Error:
    """The Error that answers ``rid`` for ``exc``: the inferd error (or internal error) it ended with,
    or its cancellation."""
    if isinstance(exc, asyncio.CancelledError):
        return cancelled(rid)
    kind, message = error_kind(exc)
    return Error(rid=rid, final=final, kind=kind, message=message)


def cancelled(rid: int) -> Error:
    """The final answer to a request cancelled in the core (its client went away, or it never started)."""
    return Error(rid=rid, final=True, kind="Cancelled", message=CANCELLED)


# -- the endpoint -------------------------------------------------------------------------------

def error_kind(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, InferdError):
        return type(exc).__name__, exc.message
    return "ModelExecutionError", f"internal error: {type(exc).__name__}: {exc}"


class Pacing:
    """A stream's responses the core may still send before the frontend credits more (a Credit message)."""

    __slots__ = ("left", "_more")

    def __init__(self, window: int) -> None:
        self.left = window
        self._more: asyncio.Future[None] | None = None

    async def take(self) -> None:
        while self.left <= 0:
            self._more = asyncio.get_running_loop().create_future()
            await self._more
        self.left -= 1

    def grant(self, n: int) -> None:
        self.left += n
        more, self._more = self._more, None
        if more is not None and not more.done():
            more.set_result(None)


class WorkerLink(Protocol):
    """What the endpoint uses of a worker as the core holds it (the supervisor's ``WorkerProcess``)."""

    index: int
    channel: Channel
    inputs: Arena  # the worker allocates; the core reads in place
    outputs: ArenaWriter  # the core allocates for the worker's responses


class DataPlaneEndpoint:
    """Serves one worker's messages against the core's data plane (on the core's loop):
    the supervisor's :class:`~inferd.serve.supervisor.Endpoint` for that worker."""

    def __init__(self, worker: WorkerLink, dataplane: Any, calls: Callable[[str, tuple, dict], Any]) -> None:
        self.worker = worker
        self.dp = dataplane
        self.calls = calls  # (method, args, kwargs) -> result or awaitable: the control plane
        self.channel = worker.channel
        self.inputs = worker.inputs
        self.outputs = worker.outputs
        self.tasks: dict[int, asyncio.Task] = {}  # stream requests
        self.credits: dict[int, Pacing] = {}  # their pacing
        self.streams: dict[int, InferenceRequest] = {}  # their requests (a Cancel may end one as a success)
        self.runs: dict[int, ModelRun] = {}  # one-response requests
        # Requests that came with frontend stamps (tracing on) until the frontend's SENT: their traces end then.
        self.sending: dict[int, FrontendStamps] = {}
        self._loop = asyncio.get_running_loop()
        self._gone = False

    # -- Endpoint -------------------------------------------------------------------

    def on_message(self, msg: ToCore) -> None:
        # type() comparisons, not a match statement: its class patterns cost the hot path ~10x more.
        if type(msg) is Infer:
            self._infer(msg)
        elif type(msg) is Free:
            free = self.outputs.free
            for block in msg.blocks:
                free(block)
        elif type(msg) is Cancel:
            run = self.runs.get(msg.rid)
            if run is not None:
                run.cancel()  # answered at once (_answered), whether or not it had started
                return
            task = self.tasks.get(msg.rid)
            if task is not None:
                request = self.streams.get(msg.rid)
                if msg.ended and request is not None:
                    request.ended_by_client = True  # counted a success, as in one process
                task.cancel()
        elif type(msg) is Sent:
            stamps = self.sending.pop(msg.rid, None)
            if stamps is not None:
                stamps.sent(msg.start, msg.end)
        elif type(msg) is Credit:
            pacing = self.credits.get(msg.rid)
            if pacing is not None:
                pacing.grant(msg.n)
        elif type(msg) is Call:
            self._loop.create_task(self._call(msg.cid, msg.method, msg.payload))
        elif type(msg) is Refused:
            self.dp.admission.count_refused(msg.n)
        else:  # Hello: the supervisor's, never delivered here
            log.warning("frontend %d sent an unexpected %s", self.worker.index, type(msg).__name__)

    def lost(self) -> None:
        """The worker died: its requests are dropped (queued ones never run)."""
        self._gone = True
        sending, self.sending = self.sending, {}
        for stamps in sending.values():
            stamps.sent(None, None)
        runs, self.runs = self.runs, {}
        for run in runs.values():
            run.cancel()
        for task in list(self.tasks.values()):
            task.cancel()

    # -- inference ------------------------------------------------------------------

    def _infer(self, msg: Infer) -> None:
        rid = msg.rid
        try:
            request = request_from(msg, self.inputs)
            if request.frontend is not None:
                self.sending[rid] = request.frontend
            flags = msg.flags
            if flags & STREAM:
                self.streams[rid] = request
                task = self.tasks[rid] = self._loop.create_task(self._stream(rid, request))
                task.add_done_callback(lambda t: self._cancelled_before_start(rid, t))
                return
            trace = msg.trace
            run = self.dp.submit(request, partial(self._answered, rid),
                                 DECOUPLED_HTTP if flags & HTTP else DECOUPLED_UNARY,
                                 None if trace is None else lambda: trace, self.channel.more)
        except Exception as exc:
            self.channel.send(failure(rid, exc))
            return
        if not run.finished:
            self.runs[rid] = run

    def _cancelled_before_start(self, rid: int, task: asyncio.Task) -> None:
        # A Cancel read with its Infer (one channel read) cancels the task before its coroutine starts:
        # the coroutine never runs, so neither its final answer nor its cleanup happen. Answered here,
        # or the worker would wait for that request's final message for ever (a drain then takes the
        # whole grace period: the soak found 674 such requests after 1,546 short client deadlines).
        if task.cancelled() and self.tasks.get(rid) is task:
            del self.tasks[rid]
            self.streams.pop(rid, None)
            self._send(cancelled(rid))

    def _answered(self, rid: int, run: ModelRun) -> None:
        """A one-response request's end (on the loop, as its batch ends, or as it is cancelled):
        Response or Error."""
        self.runs.pop(rid, None)
        message: Response | Error
        if run.error is not None:
            message = failure(rid, run.error)
        else:
            try:
                message = run_message(rid, run, self.outputs)
            except Exception as exc:
                message = failure(rid, exc)
        # The endpoint's last request answered: nothing else of this worker's will be sent this turn, so
        # this answer (with the rest of its batch's, queued before it) is written now, not a turn later.
        self._send(message, at_once=not self.runs and not self.tasks)

    async def _stream(self, rid: int, request: Any) -> None:
        ended = False
        pacing = self.credits[rid] = Pacing(STREAM_WINDOW)
        try:
            async with aclosing(self.dp.infer_stream(request)) as items:
                async for item in items:
                    if not item.final:
                        await pacing.take()  # the frontend's client is behind: the model waits
                    if item.error is not None:
                        self._send(failure(rid, item.error, item.final))
                    elif item.response is not None:
                        self._send(response_message(rid, item.final, item.response, request.requested_outputs,
                                                    self.outputs))
                    elif item.final:
                        self._send(Final(rid))
                    if item.final:
                        ended = True
                        break
        except asyncio.CancelledError:
            request.cancelled = True
        except Exception as exc:
            self._send(failure(rid, exc))
            ended = True
        finally:
            del self.tasks[rid]
            del self.credits[rid]
            self.streams.pop(rid, None)
        if not ended:
            self._send(cancelled(rid))

    def _send(self, message: ToWorker, at_once: bool = False) -> None:
        if self._gone:
            if type(message) is Response and message.block != NO_BLOCK:
                self.outputs.free(message.block)
            return
        self.channel.send(message, at_once)

    # -- the control plane ------------------------------------------------------------

    async def _call(self, cid: int, method: str, payload: bytes) -> None:
        try:
            args, kwargs = pickle.loads(payload)
            result = self.calls(method, args, kwargs)
            if asyncio.iscoroutine(result):
                result = await result
            reply = Reply(cid=cid, value=pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL), kind="", message="")
        except Exception as exc:
            if not isinstance(exc, InferdError):
                log.exception("frontend %d: call %s failed", self.worker.index, method)
            kind, message = error_kind(exc)
            reply = Reply(cid=cid, value=None, kind=kind, message=message)
        if not self._gone:
            self.channel.send(reply)
