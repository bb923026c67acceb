"""The gRPC frontend: GRPCInferenceService methods translate wire <-> domain.

Each method decodes its request, calls the data plane and encodes the answer;
domain errors become gRPC statuses through :func:`inferd.frontends.status.grpc_status`.
Nothing here decides anything about models or scheduling.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import Any

import grpc

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, InvalidArgument, Unimplemented
from inferd.facade import DataPlaneAPI, GrpcFastPath
from inferd.frontends import grpc_codec
from inferd.frontends.parameters import HeaderForward
from inferd.frontends.status import grpc_abort, grpc_status
from inferd.types import FrontendStamps, InferenceRequest

log = logging.getLogger(__name__)


def _fill_duration(target: Any, d: Any) -> None:
    target.count = d.count
    target.ns = d.ns


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Calls only the :class:`DataPlaneAPI` façade (and ModelInfer its :class:`GrpcFastPath` when
    the data plane offers one: a frontend worker's); ``clock`` turns a client's gRPC deadline into
    the absolute time the request carries; ``forward`` (--grpc-header-forward-pattern) the metadata
    that becomes request parameters."""

    def __init__(self, dataplane: DataPlaneAPI, clock: Clock | None = None,
                 forward: HeaderForward | None = None) -> None:
        self.dp = dataplane
        self.forward = forward
        self.fast_path: GrpcFastPath | None = dataplane if isinstance(dataplane, GrpcFastPath) else None
        self.clock = clock or MonotonicClock()
        self._streams: set[asyncio.Queue] = set()  # the open ModelStreamInfer streams' outboxes

    def close_streams(self, error: InferdError) -> None:
        """End every open stream with ``error``'s status (the port is closing): each stops reading
        and its client gets the status once the responses already queued are written."""
        for out in self._streams:
            out.put_nowait(_Closing(error))

    async def _abort(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        if not isinstance(exc, InferdError):
            log.exception("unexpected error", exc_info=exc)
        _unless_client_gone(context)
        await context.abort(*grpc_abort(exc))

    # -- health and metadata ---------------------------------------------------

    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerLiveResponse(live=await self.dp.server_live())

    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerReadyResponse(ready=await self.dp.server_ready())

    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
        try:
            version = grpc_codec.parse_version(request.name, request.version)
        except InferdError as exc:
            return await self._abort(context, exc)
        return pb.ModelReadyResponse(ready=await self.dp.model_ready(request.name, version))

    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]
        name, version, extensions = await self.dp.server_metadata()
        return pb.ServerMetadataResponse(name=name, version=version, extensions=extensions)

    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]
        try:
            md = await self.dp.model_metadata(request.name, grpc_codec.parse_version(request.name, request.version))
        except Exception as exc:
            return await self._abort(context, exc)
        T = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=md.name,
            versions=md.versions,
            platform=md.platform,
            inputs=[T(name=t.name, datatype=t.datatype, shape=t.shape) for t in md.inputs],
            outputs=[T(name=t.name, datatype=t.datatype, shape=t.shape) for t in md.outputs],
        )

    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]
        try:
            config = await self.dp.model_config(request.name, grpc_codec.parse_version(request.name, request.version))
        except Exception as exc:
            return await self._abort(context, exc)
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(config)
        return response

    async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]
        try:
            models = await self.dp.model_statistics(request.name, grpc_codec.parse_version(request.name, request.version))
        except Exception as exc:
            return await self._abort(context, exc)
        # Imported here: a frontend worker that answers no statistics request never loads the snapshots'
        # module, and a reply that carries snapshots has loaded it already (unpickling them).
        from inferd.observability.stats import RESPONSE_FIELDS

        response = pb.ModelStatisticsResponse()
        for s in models:
            out = response.model_stats.add()
            out.name = s.name
            out.version = str(s.version)
            out.last_inference = s.last_inference_ms
            out.inference_count = s.inference_count
            out.execution_count = s.execution_count
            st = out.inference_stats
            _fill_duration(st.success, s.success)
            _fill_duration(st.fail, s.fail)
            _fill_duration(st.queue, s.queue)
            _fill_duration(st.compute_input, s.compute_input)
            _fill_duration(st.compute_infer, s.compute_infer)
            _fill_duration(st.compute_output, s.compute_output)
            _fill_duration(st.cache_hit, s.cache_hit)
            _fill_duration(st.cache_miss, s.cache_miss)
            for b in s.batch_stats:
                bs = out.batch_stats.add()
                bs.batch_size = b.batch_size
                _fill_duration(bs.compute_input, b.compute_input)
                _fill_duration(bs.compute_infer, b.compute_infer)
                _fill_duration(bs.compute_output, b.compute_output)
            for key, r in s.response_stats.items():
                rs = out.response_stats[key]
                for field in RESPONSE_FIELDS:
                    _fill_duration(getattr(rs, field), getattr(r, field))
            for kind, device, size in s.memory_usage:
                out.memory_usage.add(type=kind, id=device, byte_size=size)
        return response

    async def RepositoryIndex(self, request, context):  # type: ignore[no-untyped-def]
        response = pb.RepositoryIndexResponse()
        for entry in await self.dp.repository_index(ready_only=request.ready):
            response.models.add(name=entry.name, version=entry.version, state=entry.state, reason=entry.reason)
        return response

    # -- inference -----------------------------------------------------------------

    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        received_ns = time.monotonic_ns()  # the request's wait counts from here
        stamps: FrontendStamps | None = None  # Triton's GRPC_* trace timestamps, only while tracing is
        # on (the fast path's proxy stamps its own)
        try:
            remaining = context.time_remaining()
            deadline = None if remaining is None else self.clock.now() + remaining
            if self.forward is not None:
                _add_parameters(request, self.forward.forwarded(_metadata(context).items()))
            if self.fast_path is not None:
                answer = await self.fast_path.grpc_infer(request, deadline, lambda: _metadata(context), received_ns)
                _unless_client_gone(context)
                return answer
            req = grpc_codec.decode_infer_request(request)
            req.received_ns = received_ns
            if deadline is not None:
                req.deadline = deadline
            if self.dp.tracing_on():
                req.frontend = stamps = FrontendStamps("grpc", received_ns, time.monotonic_ns())
            response = await self.dp.infer(req, trace_carrier=lambda: _metadata(context))
            _unless_client_gone(context)
            if stamps is None:
                return grpc_codec.encode_infer_response(response, req.requested_outputs)
            send_ns = time.monotonic_ns()
            encoded = grpc_codec.encode_infer_response(response, req.requested_outputs)
            stamps.sent(send_ns, time.monotonic_ns())  # handed to gRPC, which writes it as the handler returns
            return encoded
        except Exception as exc:
            if stamps is not None:
                now = time.monotonic_ns()
                stamps.sent(now, now)  # the error status is what is sent
            return await self._abort(context, exc)
        finally:
            if stamps is not None:
                stamps.sent(None, None)  # cancelled: the trace ends without a send (a no-op once sent)

    # -- owned by later features ---------------------------------------------------

    async def _unimplemented(self, context, what: str):  # type: ignore[no-untyped-def]
        await self._abort(context, Unimplemented(f"{what} is not supported by this inferd version"))

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]
        """The bidirectional stream. Each request runs as soon as it arrives,
        concurrently with the others (in arrival order into its model's queue);
        a decoupled model's responses are written as it sends them, the others'
        in the order their requests arrived on the stream (Triton's stream handler
        keeps that order for models that are not decoupled). A failed request
        answers with ``error_message`` and the stream carries on, as Triton's does.

        At most ``STREAM_WINDOW`` of a decoupled model's responses wait to be
        written: its request's task takes the next response from the data plane
        only once there is room, and room comes back as gRPC takes each write (its
        flow control: a client that reads slowly slows the model, never fills the
        server). The others' single answers are bounded by the requests in flight;
        such a request takes the unary call's path (``dp.infer``: the same checks,
        tracing and shedding as ModelInfer, no generator per request). The client
        going away cancels every request of the stream, down to the model. Writes
        are awaited here (``context.write``), not yielded, so that a write the
        client's departure fails ends the stream quietly instead of being logged
        by grpc."""
        out: asyncio.Queue = asyncio.Queue()
        room = asyncio.Semaphore(STREAM_WINDOW)
        tasks: set[asyncio.Task] = set()
        finished = object()  # put once the reader and every request of the stream have ended
        pending = 1  # the reader, and each request still running
        order = StreamOrder()
        decoupled = _DecoupledModels(self.dp)
        forwarded = self._stream_forwarded(context)

        def ended() -> None:  # after what ended put its last answer
            nonlocal pending
            pending -= 1
            if not pending:
                out.put_nowait(finished)

        async def run(msg, ticket):  # type: ignore[no-untyped-def]
            answers: list[Any] = []
            put = out.put_nowait if ticket is None else answers.append
            try:
                if ticket is not None:
                    try:
                        answers.append((await self._answer_one(msg, forwarded), False))
                        return
                    except Unimplemented:  # reloaded as decoupled since the stream asked? Then its answers, in order
                        if not await decoupled.check(msg, again=True):
                            raise
                # aclosing: a cancelled task closes the request's generators now, down to the model.
                async with aclosing(self._stream_one(msg, forwarded)) as messages:
                    async for message in messages:
                        if ticket is None:
                            await room.acquire()
                            out.put_nowait((message, True))
                        else:
                            answers.append((message, False))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                put((_stream_error(msg, exc), False))
            finally:
                if ticket is not None:
                    for message in order.done(ticket, answers):
                        out.put_nowait(message)
                ended()

        async def read() -> None:
            nonlocal pending
            try:
                async for msg in request_iterator:
                    pending += 1
                    ticket = None if await decoupled.check(msg) else order.ticket()
                    task = asyncio.ensure_future(run(msg, ticket))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                ended()

        reader = asyncio.ensure_future(read())
        self._streams.add(out)
        try:
            while True:
                item = await out.get()
                if item is finished:
                    break
                if isinstance(item, _Closing):
                    await context.abort(*grpc_abort(item.error))
                message, counted = item
                try:
                    await context.write(message)
                except Exception:  # the write failed: the client went away meanwhile
                    return
                if counted:
                    room.release()
        finally:
            self._streams.discard(out)
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    def _stream_forwarded(self, context: Any) -> dict[str, str] | InferdError:
        """The stream's metadata that becomes each request's parameters, or why it cannot (each
        request of the stream is then answered with it, as Triton forwards per request)."""
        if self.forward is None:
            return {}
        try:
            return self.forward.forwarded(_metadata(context).items())
        except InferdError as exc:
            return exc

    @staticmethod
    def _stream_request(msg, forwarded: dict[str, str] | InferdError) -> tuple[InferenceRequest, bool]:  # type: ignore[no-untyped-def]
        """A stream message's request, and whether it asks for Triton's final flag on each response
        (then a decoupled model that ends without a response sends an empty final one)."""
        if isinstance(msg, Undecodable):
            raise msg.error
        req = grpc_codec.decode_infer_request(msg)
        if isinstance(forwarded, InferdError):
            raise forwarded
        if forwarded:
            req.parameters.update(forwarded)
        return req, req.parameters.pop(EMPTY_FINAL, False) is True

    async def _answer_one(self, msg, forwarded: dict[str, str] | InferdError):  # type: ignore[no-untyped-def]
        """The one stream message answering a request for a model that is not decoupled: the unary
        path's call (no generator between the stream and the model); an error raises (Unimplemented for a
        model reloaded as decoupled since the stream asked)."""
        req, flagged = self._stream_request(msg, forwarded)
        response = await self.dp.infer(req)
        message = pb.ModelStreamInferResponse()
        grpc_codec.encode_infer_response(response, req.requested_outputs, into=message.infer_response)
        if flagged:
            message.infer_response.parameters[FINAL_RESPONSE].bool_param = True
        return message

    async def _stream_one(self, msg, forwarded: dict[str, str] | InferdError):  # type: ignore[no-untyped-def]
        """The stream messages answering one request for a decoupled model."""
        req, flagged = self._stream_request(msg, forwarded)
        async with aclosing(self.dp.infer_stream(req)) as items:
            async for item in items:
                if item.error is not None:
                    message = _stream_error(msg, item.error)
                elif item.response is not None:
                    message = pb.ModelStreamInferResponse()
                    grpc_codec.encode_infer_response(item.response, req.requested_outputs, into=message.infer_response)
                elif flagged:
                    message = pb.ModelStreamInferResponse()
                    r = message.infer_response
                    r.model_name, r.model_version, r.id = msg.model_name, msg.model_version, msg.id
                else:
                    continue
                if flagged:
                    message.infer_response.parameters[FINAL_RESPONSE].bool_param = item.final
                yield message

    async def RepositoryModelLoad(self, request, context):  # type: ignore[no-untyped-def]
        try:
            params = {k: grpc_codec.param_value(v) for k, v in request.parameters.items()}
            await self.dp.load_model(request.model_name, params, repository=request.repository_name)
        except Exception as exc:
            return await self._abort(context, exc)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):  # type: ignore[no-untyped-def]
        try:
            params = {k: grpc_codec.param_value(v) for k, v in request.parameters.items()}
            await self.dp.unload_model(request.model_name, params, repository=request.repository_name)
        except Exception as exc:
            return await self._abort(context, exc)
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ---------------------------------------------------------------

    async def SystemSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]
        try:
            regions = await self.dp.shm_status(request.name)
        except Exception as exc:
            return await self._abort(context, exc)
        response = pb.SystemSharedMemoryStatusResponse()
        for r in regions:
            out = response.regions[r.name]
            out.name, out.key, out.offset, out.byte_size = r.name, r.key, r.offset, r.byte_size
        return response

    async def SystemSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]
        try:
            await self.dp.shm_register(request.name, request.key, request.offset, request.byte_size)
        except Exception as exc:
            return await self._abort(context, exc)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):  # type: ignore[no-untyped-def]
        try:
            await self.dp.shm_unregister(request.name)
        except Exception as exc:  # without --allow-client-shm
            return await self._abort(context, exc)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]
        try:
            regions = await self.dp.cuda_shm_status(request.name)
        except Exception as exc:
            return await self._abort(context, exc)
        response = pb.CudaSharedMemoryStatusResponse()
        for r in regions:
            out = response.regions[r.name]
            out.name, out.device_id, out.byte_size = r.name, r.device_id, r.byte_size
        return response

    async def CudaSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]
        try:
            await self.dp.cuda_shm_register(request.name, bytes(request.raw_handle), request.device_id,
                                            request.byte_size)
        except Exception as exc:
            return await self._abort(context, exc)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request, context):  # type: ignore[no-untyped-def]
        try:
            await self.dp.cuda_shm_unregister(request.name)
        except Exception as exc:  # without --allow-client-shm
            return await self._abort(context, exc)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- tracing and logging ---------------------------------------------------------------

    async def TraceSetting(self, request, context):  # type: ignore[no-untyped-def]
        try:
            changes = {k: list(v.value) for k, v in request.settings.items()}
            settings = await self.dp.trace_settings(request.model_name, changes or None)
        except Exception as exc:
            return await self._abort(context, exc)
        response = pb.TraceSettingResponse()
        for key, values in settings.items():
            response.settings[key].value.extend(values)
        return response

    async def LogSettings(self, request, context):  # type: ignore[no-untyped-def]
        try:
            changes = {}
            for key, v in request.settings.items():
                kind = v.WhichOneof("parameter_choice")
                changes[key] = getattr(v, kind) if kind else None
            settings = await self.dp.log_settings(changes or None)
        except Exception as exc:
            return await self._abort(context, exc)
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            out = response.settings[key]
            if isinstance(value, bool):
                out.bool_param = value
            elif isinstance(value, int):
                out.uint32_param = value
            else:
                out.string_param = value
        return response


class StreamOrder:
    """One stream's answers to requests for models that are not decoupled, in arrival order:
    each such request takes a ticket when it arrives; its answers wait until every earlier
    ticket's were released. Called on the event loop only."""

    __slots__ = ("_issued", "_next", "_held")

    def __init__(self) -> None:
        self._issued = 0
        self._next = 0  # the ticket whose answers go out next
        self._held: dict[int, list[Any]] = {}

    def ticket(self) -> int:
        self._issued += 1
        return self._issued - 1

    def done(self, ticket: int, answers: list[Any]) -> list[Any]:
        """``ticket``'s request ended with ``answers``: the answers that can be written now, in order."""
        self._held[ticket] = answers
        ready: list[Any] = []
        while self._next in self._held:
            ready.extend(self._held.pop(self._next))
            self._next += 1
        return ready


class _DecoupledModels:
    """Whether a stream request's model is decoupled (model_transaction_policy), asked of the data
    plane once per (model, version) per stream, as Triton's handler asks per request."""

    __slots__ = ("_dp", "_known")

    def __init__(self, dataplane: DataPlaneAPI) -> None:
        self._dp = dataplane
        self._known: dict[tuple[str, str], bool] = {}

    async def check(self, msg: Any, again: bool = False) -> bool:
        """``again``: ask the data plane even if the stream knows (a request the unary path refused)."""
        if isinstance(msg, Undecodable):
            return False
        key = (msg.model_name, msg.model_version)
        known = None if again else self._known.get(key)
        if known is None:
            try:
                version = grpc_codec.parse_version(msg.model_name, msg.model_version)
                config = await self._dp.model_config(msg.model_name, version)
                known = bool(config.model_transaction_policy.decoupled)
            except Exception:  # not found, not ready: the request fails in order, as Triton's does
                return False
            # Kept for the stream's life: a model reloaded as decoupled mid-stream is found out by the
            # unary path's refusal (the request is then asked about again, and takes the decoupled path).
            self._known[key] = known
        return known


class _Closing:
    """Put in a stream's outbox to end the stream with ``error``'s status."""

    __slots__ = ("error",)

    def __init__(self, error: InferdError) -> None:
        self.error = error


STREAM_WINDOW = 64  # responses of one ModelStreamInfer stream waiting for gRPC to take them


def _metadata(context) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The request's gRPC metadata (text values): the carrier of the W3C trace context, and the
    headers --grpc-header-forward-pattern forwards."""
    return {m.key: m.value for m in context.invocation_metadata() or () if isinstance(m.value, str)}


def _add_parameters(request: pb.ModelInferRequest, forwarded: dict[str, str]) -> None:
    """Forwarded headers as string parameters of the request, over any of the same name."""
    for key, value in forwarded.items():
        request.parameters[key].string_param = value


EMPTY_FINAL = "triton_enable_empty_final_response"  # a stream request's parameter
FINAL_RESPONSE = "triton_final_response"  # then set on every response of the stream


def _stream_error(msg: Any, exc: BaseException) -> Any:
    """A failed stream request's answer: its error in ``error_message``."""
    _, message = grpc_status(exc)
    if not isinstance(exc, InferdError):
        log.exception("unexpected error in a stream request", exc_info=exc)
    response = pb.ModelStreamInferResponse(error_message=message)
    r = response.infer_response
    r.model_name, r.model_version, r.id = msg.model_name, msg.model_version, msg.id
    return response


class Undecodable:
    """A request whose bytes are not a valid message. The deserializer returns it instead of
    raising (grpc would answer UNKNOWN with the exception's name); the method answers it with
    INVALID_ARGUMENT, a stream with an error response for that message, and carries on."""

    __slots__ = ("error",)
    model_name = model_version = id = ""  # what a stream's error response echoes

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def _decoder(method: str, message_type: Any):  # type: ignore[no-untyped-def]
    parse = message_type.FromString
    full_name = message_type.DESCRIPTOR.full_name

    def decode(data: bytes):  # type: ignore[no-untyped-def]
        try:
            return parse(data)
        except Exception as exc:  # protobuf's DecodeError, or whatever a malformed buffer raises
            return Undecodable(InvalidArgument(
                f"{method}: the request ({len(data)} bytes) is not a valid {full_name} message ({exc}); "
                f"send a serialized {full_name} as defined in grpc_service.proto"))

    return decode


def _unless_client_gone(context: grpc.aio.ServicerContext) -> None:
    """Raise CancelledError, so that grpc.aio sends nothing, when the call is already over for the client
    (it cancelled, or the deadline it sent has passed, which gRPC answers itself with DEADLINE_EXCEEDED).

    grpc.aio (1.85 and earlier) leaks a batch's ops, and the response message they hold, whenever a send
    on a finished call fails (grpc/grpc#43360): an answer or an abort written after the client left cost
    a frontend 86 bytes per client cancel and 2 KB per passed deadline, the soak's RSS slope. A handler
    that ends in CancelledError makes grpc.aio log it at debug level and start no batch."""
    if context.cancelled() or ((left := context.time_remaining()) is not None and left <= 0):
        raise asyncio.CancelledError


def _guarded(servicer: InferenceServicer, method):  # type: ignore[no-untyped-def]
    async def call(request, context):  # type: ignore[no-untyped-def]
        if isinstance(request, Undecodable):
            return await servicer._abort(context, request.error)
        return await method(request, context)

    return call


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Every method of GRPCInferenceService, with deserializers that turn undecodable bytes
    into an INVALID_ARGUMENT answer (the generated registration would let them raise)."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for m in service.methods:
        request_type, response_type = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        decode, encode = _decoder(m.name, request_type), response_type.SerializeToString
        method = getattr(servicer, m.name)
        if m.client_streaming and m.server_streaming:
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(
                method, request_deserializer=decode, response_serializer=encode)
        elif m.client_streaming or m.server_streaming:
            raise TypeError(f"{m.full_name}: only unary and bidirectional methods are served")
        else:
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                _guarded(servicer, method), request_deserializer=decode, response_serializer=encode)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
