"""The protocol-neutral data plane that the gRPC and HTTP frontends share.

Frontends decode the wire into :class:`InferenceRequest` (numpy arrays) and
encode what comes back; everything in between happens here: find the model,
validate, schedule, shape the outputs, count.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from inferd.clock import Clock, MonotonicClock
from inferd.errors import DeadlineExceeded, InferdError
from inferd.repository import ModelManager
from inferd.repository.model import Model
from inferd.server.validation import check_requested_outputs, prepare_inputs, shape_outputs
from inferd.types import InferenceRequest, InferenceResponse

SERVER_NAME = "inferd"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["classification", "model_repository", "schedule_policy", "model_configuration", "statistics"]


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

    # -- health and metadata ---------------------------------------------------

    def server_ready(self) -> bool:
        return self.live and not self.draining and self.manager.all_ready()

    def model_ready(self, name: str, version: int = 0) -> bool:
        return not self.draining and self.manager.is_ready(name, version)

    def server_metadata(self) -> tuple[str, str, list[str]]:
        return SERVER_NAME, SERVER_VERSION, list(EXTENSIONS)

    def model(self, name: str, version: int = 0) -> Model:
        return self.manager.get(name, version)

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

    # -- inference -----------------------------------------------------------------

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        model = self.manager.get(request.model_name, request.model_version)
        spec = model.spec
        stats = model.stats
        start = time.perf_counter_ns()
        try:
            inputs, rows = prepare_inputs(spec, request)
            check_requested_outputs(spec, request.requested_outputs)
            request.inputs = inputs
            outputs = await model.scheduler.infer(request, rows)
            result = shape_outputs(spec, outputs, request.requested_outputs)
        except asyncio.CancelledError:
            stats.record_failure(time.perf_counter_ns() - start, "CANCELED", self.clock.now())
            raise
        except InferdError as exc:
            reason = "TIMEOUT" if isinstance(exc, DeadlineExceeded) else exc.grpc_code.name
            stats.record_failure(time.perf_counter_ns() - start, reason, self.clock.now())
            raise
        except Exception:
            stats.record_failure(time.perf_counter_ns() - start, "INTERNAL", self.clock.now())
            raise
        stats.record_success(time.perf_counter_ns() - start, self.clock.now())
        return InferenceResponse(
            model_name=spec.name, model_version=model.version, outputs=result, id=request.id
        )


def _platform(model: Model) -> str:
    # Triton reports the platform for ONNX/TorchScript/ensembles, and the
    # backend's name for backend-only models such as python.
    return model.spec.platform or model.spec.backend

