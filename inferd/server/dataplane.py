"""The protocol-neutral data plane that the gRPC and HTTP frontends share.

Frontends decode the wire into :class:`InferenceRequest` (numpy arrays) and
encode what comes back; everything in between happens here: find the model,
validate, schedule, shape the outputs, count.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator, Mapping

from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, InvalidArgument, ModelExecutionError, Unavailable, Unimplemented
from inferd.observability.log_settings import LogSettings
from inferd.observability.tracing import Tracing
from inferd.repository import IndexEntry, ModelManager, control
from inferd.model import DECOUPLED_UNARY, Model, check_requested_outputs, prepare_inputs, shape_outputs
from inferd.model import infer as model_infer
from inferd.server.shared_memory import SharedMemoryManager
from inferd.types import InferenceRequest, InferenceResponse
from inferd.streaming import ResponseSink, StreamEvent, StreamResponse

SERVER_NAME = "inferd"
SERVER_VERSION = "0.1.0"
EXTENSIONS = [
    "classification", "sequence", "model_repository", "schedule_policy", "model_configuration", "statistics",
    "binary_tensor_data", "parameters", "model_repository(unload_dependents)", "system_shared_memory", "trace", "logging",
]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class DataPlane:
    def __init__(self, manager: ModelManager, clock: Clock | None = None) -> None:
        self.manager = manager
        self.clock = clock or MonotonicClock()
        self.live = True
        self.draining = False
        self.shared_memory = SharedMemoryManager()
        self.tracing = Tracing()  # off; the server replaces it from --trace-config
        self.log_settings = LogSettings()
        self.loading = False  # the server's start-up loading: not ready yet

    # -- health and metadata ---------------------------------------------------

    def server_ready(self) -> bool:
        return self.live and not self.draining and not self.loading and self.manager.all_ready()

    def model_ready(self, name: str, version: int = 0) -> bool:
        return not self.draining and self.manager.is_ready(name, version)

    def server_metadata(self) -> tuple[str, str, list[str]]:
        return SERVER_NAME, SERVER_VERSION, list(EXTENSIONS)

    def model(self, name: str, version: int = 0) -> Model:
        return self.manager.get(name, version)

    def statistics_models(self, name: str, version: int = 0) -> list[Model]:
        """The model versions a statistics request names: all, one model's, or one version."""
        if not name:
            models = self.manager.models()
        elif version:
            models = [self.manager.get(name, version)]
        else:
            models = [m for m in self.manager.models() if m.name == name]
            if not models:
                self.manager.get(name)  # raises the right error
        return sorted(models, key=lambda m: (m.name, m.version))

    def model_metadata(self, name: str, version: int = 0) -> ModelMetadata:
        model = self.manager.get(name, version)
        spec = model.spec
        lead = [-1] if spec.max_batch_size > 0 else []
        versions = [str(m.version) for m in self.manager.models() if m.name == name]
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=_platform(model),
            inputs=[TensorMetadata(t.name, t.datatype.name, lead + list(t.dims)) for t in spec.inputs.values()],
            outputs=[TensorMetadata(t.name, t.datatype.name, lead + list(t.dims)) for t in spec.outputs.values()],
        )

    # -- model repository (model control) ------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.manager.index(ready_only=ready_only)

    async def load_model(self, name: str, parameters: Mapping[str, object] | None = None,
                         repository: str = "") -> None:
        """RepositoryModelLoad: (re)load ``name``; ``parameters``: plain values
        (``config``: a JSON ModelConfig; ``file:`` ones are refused). Explicit mode only."""
        control.require_explicit(self.manager, f"failed to load '{name}'")
        _check_repository(repository, name)
        config = control.load_parameters(name, parameters or {})
        await self.manager.load_model(name, config)

    async def unload_model(self, name: str, parameters: Mapping[str, object] | None = None,
                           repository: str = "") -> None:
        """RepositoryModelUnload (``unload_dependents``: also the ensembles that use it). Explicit mode only."""
        control.require_explicit(self.manager, f"failed to unload '{name}'")
        _check_repository(repository, name)
        await self.manager.unload_model(name, control.unload_parameters(name, parameters or {}))

    # -- inference -----------------------------------------------------------------

    def refuse_if_draining(self) -> None:
        """Frontends call this before taking a client's inference request. A
        drain refuses new ones and lets accepted ones finish; in-process calls
        (a Python model's BLS) are not refused, they serve accepted requests."""
        if self.draining:
            raise Unavailable("inferd is shutting down and takes no new inference requests")

    def inflight(self) -> int:
        """Requests accepted by a scheduler and not yet answered, over every model."""
        return sum(m.scheduler.inflight() for m in self.manager.models())

    async def infer(self, request: InferenceRequest, decoupled_error: str = DECOUPLED_UNARY) -> InferenceResponse:
        """Run one request. A frontend that started a trace (``request.trace``)
        leaves ending it to this method; outputs requested into shared memory
        are written there (the frontend then sends no data for them).
        ``decoupled_error``: the frontend's words refusing a decoupled model."""
        return await model_infer(self.manager.get, request, self.clock, decoupled_error)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        """Run one request and yield its responses as they come (ModelStreamInfer).

        A plain model gives one response, final. A decoupled model gives what
        its Python code sends: zero or more responses (or errors), then the
        final flag (on the last response, or alone). Errors are yielded, as
        final responses where they end the request; only cancellation raises.
        """
        try:
            model = self.manager.get(request.model_name, request.model_version)
        except InferdError as exc:
            yield StreamResponse(error=exc, final=True)
            return
        if not model.decoupled:
            try:
                response = await self.infer(request)
            except InferdError as exc:
                yield StreamResponse(error=exc, final=True)
                return
            yield StreamResponse(response=response, final=True)
            return
        async for item in self._infer_decoupled(model, request):
            yield item

    async def _infer_decoupled(self, model: Model, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        spec, stats = model.spec, model.stats
        start = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        sink = ResponseSink(loop)
        request.responder = sink
        try:
            inputs, rows = prepare_inputs(spec, request)
            check_requested_outputs(spec, request.requested_outputs)
        except InferdError as exc:
            stats.record_failure(time.perf_counter_ns() - start, exc.grpc_code.name, self.clock.now())
            yield StreamResponse(error=exc, final=True)
            return
        request.inputs = inputs
        task = loop.create_task(model.scheduler.infer(request, rows))

        def executed(t: asyncio.Task) -> None:
            # The request never reached the model (refused, queue full, ...): that ends it.
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                error = exc if isinstance(exc, InferdError) else ModelExecutionError(
                    f"model '{spec.name}' failed to execute: {type(exc).__name__}: {exc}")
                sink.put(StreamEvent(error=error, final=True))

        task.add_done_callback(executed)
        failure = ""
        try:
            while True:
                event = await sink.get()
                if event.error is not None:
                    failure = failure or event.error.grpc_code.name
                    yield StreamResponse(error=event.error, final=event.final)
                elif event.outputs is not None:
                    try:
                        result = shape_outputs(spec, event.outputs, request.requested_outputs)
                    except InferdError as exc:
                        failure = failure or exc.grpc_code.name
                        yield StreamResponse(error=exc, final=event.final)
                    else:
                        response = InferenceResponse(model_name=spec.name, model_version=model.version,
                                                     outputs=result, id=request.id)
                        yield StreamResponse(response=response, final=event.final)
                else:
                    yield StreamResponse(final=True)
                if event.final:
                    break
        except BaseException:  # cancelled, or the consumer closed the stream
            request.cancelled = sink.cancelled = True
            if not task.done():
                task.cancel()
            stats.record_failure(time.perf_counter_ns() - start, "CANCELED", self.clock.now())
            raise
        if failure:
            stats.record_failure(time.perf_counter_ns() - start, failure, self.clock.now())
        else:
            stats.record_success(time.perf_counter_ns() - start, self.clock.now())


def _check_repository(repository: str, name: str) -> None:
    # One namespace over every --model-repository, as Triton without named repositories.
    if repository:
        raise InvalidArgument(f"model '{name}': repository_name '{repository}': named repositories are not "
                              "supported; leave it empty")


def _platform(model: Model) -> str:
    # Triton reports the platform for ONNX/TorchScript/ensembles, and the
    # backend's name for backend-only models such as python.
    return model.spec.platform or model.spec.backend

