"""What a backend provides: a model file's signature, and instances that run.

An instance executes a whole batch of requests at once. Tensor backends
(ONNX Runtime, TorchScript) derive from :class:`TensorInstance`, which joins
the requests' inputs along the batch dimension, runs once and splits the
outputs; the Python backend hands the list of requests to user code.
"""

from __future__ import annotations

import abc
import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

import numpy as np

from inferd.backends.batching import Joined, join, request_rows, split
from inferd.backends.pool import BufferPool
from inferd.backends.session_cache import SessionCache
from inferd.config import BackendCapabilities, ModelConfig, ModelSignature, ModelSpec
from inferd.errors import ConfigError, InferdError, ModelExecutionError
from inferd.streaming import StreamResponse
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
    """One output dict (or error) per request of the batch, in order. ``memory_delta``: how many
    bytes the process's resident memory grew (negative: shrank) while the model's own code ran,
    for backends that measure it (Python models); None where it is not measured."""

    outputs: list[dict[str, np.ndarray] | InferdError]
    times: ExecutionTimes = field(default_factory=ExecutionTimes)
    # Padded batches: elements of the requests' own data in padded inputs, and of padding.
    real_elements: int = 0
    pad_elements: int = 0
    memory_delta: int | None = None
    # Iterative sequences: per row, whether the model released its request with
    # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (run it again at the next step).
    # None: no row was rescheduled.
    reschedule: list[bool] | None = None


_STATM: int | None = None
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """The process's resident memory now (Linux /proc/self/statm; 0 elsewhere). ~2 us: one pread."""
    global _STATM
    try:
        if _STATM is None:
            _STATM = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(_STATM, 64, 0).split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


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

    def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        """Every response to ``request`` as it comes (a decoupled model's many, another's one),
        the last one ``final``; errors are yielded. On ``loop`` only; closing it early cancels
        the request."""
        ...

    # The model loading API (pb_utils.load_model / unload_model / is_model_ready), on ``loop`` only;
    # each raises the domain error a RepositoryModelLoad / Unload client would see.

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        """Load or reload ``name`` (``config``: a JSON ModelConfig or ""; ``files``: ``file:<path>`` ->
        bytes, an override model folder); returns once it serves."""
        ...

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        """Start unloading ``name``: new requests are refused at once; returns without waiting
        for the accepted ones (as Triton's TRITONSERVER_ServerUnloadModel)."""
        ...

    async def model_is_ready(self, name: str, version: int) -> bool:
        """Whether ``name`` (``version``; 0 = as its policy chooses) is loaded, serving and (its
        own ``is_ready``, if it has one) ready by its own word."""
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
    # Where the backend may keep what it derives from the model file for the next load of the same
    # file (the ONNX backend: the optimised model); None: nothing is kept.
    session_cache: SessionCache | None = field(default=None, compare=False, repr=False)


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
    # The model's own readiness check (a Python model's ``is_ready``): blocking, called off the loop
    # when a client asks whether the model is ready (inferd.model.readiness); None: no check of its own.
    ready_check: Callable[[], bool] | None = None

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


@dataclass(slots=True)
class Assembled:
    """A batch's inputs joined ahead of its execution (:meth:`TensorInstance.assemble`)."""

    joined: Joined
    input_ns: int


class TensorInstance(ModelInstance):
    """Base for runtimes that take one tensor per input for the whole batch.

    A batch's inputs are joined (concatenated; padded, masked or ragged for a model
    with variable-length batching: :mod:`inferd.backends.batching`) into buffers
    from the instance's :class:`~inferd.backends.pool.BufferPool`
    (``inferd.pooled_buffers``), the runtime runs once, and the outputs are split
    back per request as views. The scheduler joins a batch with :meth:`assemble`
    on the event loop, while the instance's thread may still execute the batch
    before it, and runs it with :meth:`execute_assembled`; :meth:`execute` does both.
    """

    # The scheduler may call assemble (on the loop) and execute_assembled (on the instance's
    # thread) instead of execute.
    assembles_ahead = True

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.pool: BufferPool | None = BufferPool() if spec.params.pooled_buffers else None

    @abc.abstractmethod
    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        """One call of the runtime."""

    def assemble(self, inputs: Sequence[dict[str, np.ndarray]]) -> Assembled:
        """Join a batch's inputs (each request copied once, into a pooled buffer)."""
        t0 = time.perf_counter_ns()
        joined = join(inputs, self.model.varlen, self.pool, self.model.max_batch_size)
        return Assembled(joined, time.perf_counter_ns() - t0)

    def execute_assembled(self, assembled: Assembled, output_names: Sequence[str]) -> BatchResult:
        joined = assembled.joined
        t1 = time.perf_counter_ns()
        try:
            out = self.run(joined.inputs, output_names)
        except InferdError:
            raise
        except Exception as exc:
            raise ModelExecutionError(f"model '{self.model.name}' failed to execute: {exc}") from exc
        t2 = time.perf_counter_ns()
        results: list[dict[str, np.ndarray] | InferdError] = list(
            split(self.model.name, joined, out, self.model.varlen))
        times = ExecutionTimes(assembled.input_ns, t2 - t1, time.perf_counter_ns() - t2)
        return BatchResult(results, times, joined.real_elements, joined.pad_elements)

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        return self.execute_assembled(self.assemble(inputs), output_names)


def split_batch(inputs: Sequence[dict[str, Any]], out: dict[str, Any]) -> list[dict[str, Any] | InferdError]:
    """The batch's outputs cut back into one dict per request, by each request's rows (views, no copy)."""
    return list(split("", Joined({}, request_rows(inputs)), out))


class Backend(BackendCapabilities, abc.ABC):
    """A runtime family: reads model files and creates instances.

    What it can do (its names, model file, decoupled, undeclared inputs, joined
    batches, GPUs, how an iterative sequence ends) are class attributes, declared
    with their defaults in :class:`~inferd.config.BackendCapabilities`, which the
    config pipeline reads; a subclass overrides those it answers differently.
    A backend class is registered with :func:`inferd.backends.register` or through
    the ``inferd.backends`` entry point group, and is created with no arguments."""

    def signature(self, model_file: Path, model_name: str) -> ModelSignature | None:
        """The model file's own tensors, for auto-complete and validation."""
        return None

    def complete_config(self, config: ModelConfig, model_file: Path) -> None:
        """Complete or check ``config`` in place before validation (the Python
        backend runs a model's ``auto_complete_config`` here). Blocking. The one
        place a backend sees the protobuf: it runs inside the config pipeline
        (:func:`inferd.config.prepare_config`); instances get the plain ModelSpec."""

    @abc.abstractmethod
    def create_instance(self, spec: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        """Load the model onto ``instance.device``; blocking, called off the loop."""

    def ignored_optimizations(self, spec: ModelSpec, kinds: set[str]) -> list[tuple[str, str]]:
        """Which of ``spec.optimization``'s settings this backend does not honour for instances
        of ``kinds`` ("cpu", "cuda"), each with why: said in one warning line at load. By
        default every one (a backend that maps some overrides this)."""
        return [(field, f"the {self.name} backend has no such setting") for field in spec.optimization.requested()]


def sample_inputs(spec: ModelSpec, rows: int = 1) -> dict[str, np.ndarray]:
    """``rows`` rows of zeros per input (variable dimensions as 1), in model shapes; a model that does
    not batch gets one, without the batch dimension."""
    lead = (rows,) if spec.max_batch_size > 0 else ()
    out = {}
    for t in spec.inputs.values():
        shape = lead + tuple(1 if d == -1 else d for d in t.model_dims)
        if t.datatype.name == "BYTES":
            out[t.name] = np.full(shape, b"", dtype=np.object_)
        else:
            out[t.name] = np.zeros(shape, dtype=t.datatype.numpy)
    return out


def file_bytes(path: Path) -> int:
    """The size of a model's files: one file's, or a folder's (a file gone meanwhile counts 0). The
    least a loaded model can hold (its weights): the estimate before a first load is measured, and
    what bounds a second copy of them."""
    if not path.is_dir():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


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
