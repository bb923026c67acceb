"""The protocol-neutral data plane that the gRPC and HTTP frontends share.

Frontends decode the wire into :class:`InferenceRequest` (numpy arrays) and
encode what comes back; everything in between happens here: find the model,
validate, schedule, shape the outputs, count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Mapping

from inferd.clock import Clock, MonotonicClock
from inferd.errors import InvalidArgument, Unavailable
from inferd.observability.log_settings import LogSettings
from inferd.observability.tracing import Tracing
from inferd.model import DECOUPLED_UNARY, Model
from inferd.model import infer as model_infer
from inferd.model import infer_stream as model_infer_stream
from inferd.repository import IndexEntry, ModelManager, control
from inferd.server.shared_memory import SharedMemoryManager
from inferd.types import InferenceRequest, InferenceResponse
from inferd.streaming import StreamResponse

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
        async for item in model_infer_stream(self.manager.get, request, self.clock):
            yield item


def _check_repository(repository: str, name: str) -> None:
    # One namespace over every --model-repository, as Triton without named repositories.
    if repository:
        raise InvalidArgument(f"model '{name}': repository_name '{repository}': named repositories are not "
                              "supported; leave it empty")


def _platform(model: Model) -> str:
    # Triton reports the platform for ONNX/TorchScript/ensembles, and the
    # backend's name for backend-only models such as python.
    return model.spec.platform or model.spec.backend

