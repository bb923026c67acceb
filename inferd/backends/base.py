"""What a backend provides: a model file's signature, and instances that run.

An instance executes a whole batch of requests at once. Tensor backends
(ONNX Runtime, TorchScript) derive from :class:`TensorInstance`, which joins
the requests' inputs along the batch dimension, runs once and splits the
outputs; the Python backend hands the list of requests to user code.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from inferd.config import ModelConfig, ModelSignature, ModelSpec
from inferd.errors import ConfigError, InferdError, ModelExecutionError
from inferd.types import InferenceRequest, InferenceResponse


@dataclass(frozen=True, slots=True)
class Device:
    kind: str  # "cpu" or "cuda"
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


@dataclass(slots=True)
class ExecutionTimes:
    """Nanoseconds spent in one execution, for ModelStatistics."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


@dataclass(slots=True)
class BatchResult:
    """One output dict (or error) per request of the batch, in order."""

    outputs: list[dict[str, np.ndarray] | InferdError]
    times: ExecutionTimes = field(default_factory=ExecutionTimes)


class InferenceDispatcher(Protocol):
    """What an instance may call in the server: run a request on another loaded
    model (a Python model's BLS call), scheduled with that model's other traffic.

    Implemented above the backends (``inferd.model.ModelDispatcher``) and handed
    to each instance in its :class:`InstanceSpec`, so a backend never imports
    the layers that serve it.
    """

    # The event loop ``infer`` runs on; None until the server runs one.
    loop: asyncio.AbstractEventLoop | None

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """The request's response, or the domain error a client would see; on ``loop`` only."""
        ...


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Which instance to create: its name, device, and the model's files;
    ``dispatcher``: how it reaches other models (None outside a server)."""

    name: str
    device: Device
    model_dir: Path
    version_dir: Path
    version: int
    model_file: Path
    threads: int  # intra-op threads this instance may use (cores / instances)
    group: int = 0  # the index of its instance_group in the config
    dispatcher: InferenceDispatcher | None = field(default=None, compare=False, repr=False)


class RequestInputs(dict):
    """One request's inputs, as ``execute`` sees them, and the request itself.

    Given instead of a plain dict to instances whose ``wants_requests`` is true.
    """

    __slots__ = ("request",)

    def __init__(self, request: InferenceRequest) -> None:
        super().__init__(request.inputs)
        self.request = request


class ModelInstance(abc.ABC):
    """One loaded copy of a model on one device.

    ``execute`` is called with a batch of requests that the scheduler grouped;
    it blocks while the runtime computes, and is called from an instance's
    worker thread (or on the event loop for models known to be fast). It is
    never called concurrently on the same instance.
    """

    # The Python backend reads each request's id, parameters and requested
    # outputs: for such instances the scheduler passes RequestInputs.
    wants_requests: bool = False
    # Instances running user code that may block (or call other models) must
    # never execute inline on the event loop, whatever ``inferd.execution`` says.
    thread_only: bool = False

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        self.model = spec
        self.spec = instance
        self.name = instance.name
        self.device = instance.device

    @abc.abstractmethod
    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        """Run a batch: ``inputs[i]`` holds request i's tensors (model shapes)."""

    def close(self) -> None:
        """Release the runtime's resources; called once, after the last execute."""


class TensorInstance(ModelInstance):
    """Base for runtimes that take one tensor per input for the whole batch."""

    @abc.abstractmethod
    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        """One call of the runtime."""

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        times = ExecutionTimes()
        t0 = time.perf_counter_ns()
        if len(inputs) == 1:
            joined = inputs[0]
        else:
            joined = {name: np.concatenate([r[name] for r in inputs]) for name in inputs[0]}
        t1 = time.perf_counter_ns()
        try:
            out = self.run(joined, output_names)
        except InferdError:
            raise
        except Exception as exc:
            raise ModelExecutionError(f"model '{self.model.name}' failed to execute: {exc}") from exc
        t2 = time.perf_counter_ns()
        if len(inputs) == 1:
            results: list[dict[str, np.ndarray] | InferdError] = [out]
        else:
            results = []
            start = 0
            for r in inputs:
                rows = len(next(iter(r.values()))) if r else 0
                results.append({k: v[start:start + rows] for k, v in out.items()})
                start += rows
        times.input_ns = t1 - t0
        times.infer_ns = t2 - t1
        times.output_ns = time.perf_counter_ns() - t2
        return BatchResult(results, times)


class Backend(abc.ABC):
    """A runtime family: reads model files and creates instances."""

    name: str = ""
    platform: str = ""
    default_filename: str = ""

    def signature(self, model_file: Path, model_name: str) -> ModelSignature | None:
        """The model file's own tensors, for auto-complete and validation."""
        return None

    def gpu_available(self) -> bool:
        return False

    def complete_config(self, config: ModelConfig, model_file: Path) -> None:
        """Complete or check ``config`` in place before validation (the Python
        backend runs a model's ``auto_complete_config`` here). Blocking. The one
        place a backend sees the protobuf: it runs inside the config pipeline
        (:func:`inferd.config.prepare_config`); instances get the plain ModelSpec."""

    @abc.abstractmethod
    def create_instance(self, spec: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        """Load the model onto ``instance.device``; blocking, called off the loop."""


def int_parameter(model: str, params: dict[str, str], key: str, default: int) -> int:
    """A config ``parameters`` value that must be an integer >= 0 (thread counts, ...)."""
    raw = params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"model '{model}': parameter '{key}' must be an integer >= 0, got '{raw}'")
    return value
