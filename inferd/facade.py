"""The façade the frontends call: :class:`DataPlaneAPI`, and the plain data it speaks.

Both frontends (gRPC, HTTP) and the gRPC health service call only these
methods; :class:`~inferd.dataplane.plane.DataPlane` implements them in the
process that holds the models, and a frontend worker's
:class:`~inferd.handoff.worker.proxy.RemoteDataPlane` over the hand-off. This
module imports only the core types (it is in the core layer), so a frontend
worker process that loads it, the wire protocol and the frontends loads
nothing of the models: no config pipeline of its own, scheduler, backend,
repository or batch-job engine. The values the layers below produce for the
façade (:class:`IndexEntry`, the region statuses) and the words every side
shares (``DECOUPLED_*``, ``DRAINING``) are defined here for that reason. Every method is ``async`` and takes and returns
plain, picklable data (dataclasses, dicts, lists, numpy arrays, the domain
errors), so that a frontend in another process can hold a proxy with this
same interface that forwards each call over IPC, and the frontends cannot
tell the difference. Two values pass through opaque:

- :meth:`model_config` returns the ``ModelConfig`` message as ``inferd.config``
  produced it: the ModelConfig RPC sends it as it is and HTTP renders it with
  ``inferd._proto.json.message_to_dict``; a protobuf message pickles (it serializes
  itself), so a proxy needs nothing else, and the in-process call copies nothing.
- ``infer``'s ``trace_carrier`` is a callable that gives the request's W3C
  trace headers, read only when the request is sampled; a proxy calls it (when
  tracing is on) before the hop.

Requests and responses are :mod:`inferd.types` (numpy arrays; tensors in a
client's shared memory as :class:`~inferd.types.SharedTensor` /
:class:`~inferd.types.ShmRef` references, resolved by the data plane).
Errors are :mod:`inferd.errors` types; the frontends map them to statuses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping, NamedTuple, Protocol, runtime_checkable

from inferd.streaming import StreamResponse
from inferd.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:  # the statistics snapshots load with the first answer that carries them (__getattr__)
    from inferd.observability.stats import BatchStatistics, ModelStatistics

__all__ = [
    "DECOUPLED_HTTP", "DECOUPLED_UNARY", "DRAINING", "BatchStatistics", "CudaRegionStatus", "DataPlaneAPI",
    "GrpcFastPath", "IndexEntry", "ModelMetadata", "ModelStatistics", "RegionStatus", "ServerMetadata", "TensorMetadata",
    "TraceCarrier",
]

_STATISTICS = ("BatchStatistics", "ModelStatistics")


def __getattr__(name: str) -> Any:
    """The statistics snapshots the façade speaks, named here but defined with the counters
    (:mod:`inferd.observability.stats`) and imported on first use: a frontend worker meets them only
    when it answers a statistics request, whose pickled reply imports them itself."""
    if name in _STATISTICS:
        from inferd.observability import stats

        return getattr(stats, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Triton's words for a one-response call to a decoupled model (clients match on them): gRPC ModelInfer's
# (and a Python model's BLS call's), and HTTP's.
DECOUPLED_UNARY = "ModelInfer RPC doesn't support models with decoupled transaction policy"
DECOUPLED_HTTP = "HTTP end point doesn't support models with decoupled transaction policy"
# Why inference is refused while the server drains (UNAVAILABLE), in the core and in a draining worker alike.
DRAINING = "inferd is shutting down and takes no new inference requests"

# The request's headers / gRPC metadata, for the W3C trace context; called only when the request is traced.
TraceCarrier = Callable[[], Mapping[str, str]]


# /v1 (inferd.frontends.openai): a model's OpenAI settings, read at load by config/_openai.py and handed to
# every frontend process through openai_models().
@dataclass(frozen=True, slots=True)
class OpenAISpec:
    kind: str
    tokenizer: str  # tokenizer.json's text ("" in a spec sent without its assets)
    chat_template: str = ""
    bos_token: str = ""
    eos_token: str = ""
    max_context: int = 0
    max_new_tokens: int = 0  # the model's own limit on a completion (0: unknown); reaching it is finish "length"
    text_input: str = ""
    text_output: str = ""
    ids_input: str = ""
    embedding_output: str = ""
    pooling: str = "none"
    normalize: bool = False
    dimensions: tuple[int, ...] = ()
    full_dimension: int = 0  # the embedding's size (embedding models)
    batched: bool = False  # max_batch_size > 0: a request's tensors have the batch dimension first
    text_shape: tuple[int, ...] = ()  # the prompt tensor's shape (batch dimension included)
    ids_dtype: str = ""  # "int64" or "int32": the token ids' numpy type (embedding models)
    digest: str = ""  # of everything above: a frontend keeps the assets while it is unchanged

    def without_assets(self) -> "OpenAISpec":
        return replace(self, tokenizer="", chat_template="")


class OpenAIModel(NamedTuple):
    """A ready model served under ``/v1`` (what ``DataPlaneAPI.openai_models`` answers)."""

    name: str
    version: int
    spec: OpenAISpec


class ServerMetadata(NamedTuple):
    name: str
    version: str
    extensions: list[str]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of RepositoryIndex: a model version (``version`` "" for a model with none loaded)."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered system shared memory region."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class CudaRegionStatus:
    """A registered CUDA shared memory region."""

    name: str
    device_id: int
    byte_size: int


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


class DataPlaneAPI(Protocol):
    """What a frontend may ask of the server. ``version`` 0: as the version policy chooses."""

    # -- health and metadata ---------------------------------------------------

    async def server_live(self) -> bool: ...

    async def server_ready(self) -> bool:
        """Live, not loading, not draining, and every wanted model ready."""
        ...

    async def model_ready(self, name: str, version: int = 0) -> bool: ...

    async def server_metadata(self) -> ServerMetadata: ...

    async def model_metadata(self, name: str, version: int = 0) -> ModelMetadata: ...

    async def model_config(self, name: str, version: int = 0) -> Any:
        """The model's ``ModelConfig`` message, as completed and validated at load (opaque here)."""
        ...

    async def model_statistics(self, name: str = "", version: int = 0) -> list[ModelStatistics]:
        """Snapshots of every loaded version (no ``name``), of one model's, or of one version,
        sorted by (name, version)."""
        ...

    # -- model repository ----------------------------------------------------------

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]: ...

    async def openai_models(self, name: str = "", assets: bool = False) -> list[OpenAIModel]:
        """The ready models served under ``/v1`` (``inferd.openai``), the latest version of each, or of
        ``name`` only (an unknown or unready ``name``: its error). ``assets``: with the tokenizer and the
        chat template (else without: a frontend keeps them while the spec's ``digest`` holds)."""
        ...

    async def load_model(self, name: str, parameters: Mapping[str, object] | None = None,
                         repository: str = "") -> None:
        """RepositoryModelLoad; ``parameters``: plain values (``config``: a JSON ModelConfig)."""
        ...

    async def unload_model(self, name: str, parameters: Mapping[str, object] | None = None,
                           repository: str = "") -> None:
        """RepositoryModelUnload (``unload_dependents``: bool)."""
        ...

    # -- system shared memory --------------------------------------------------------

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    async def shm_status(self, name: str = "") -> list[RegionStatus]:
        """Every region (no ``name``), or the one named (NotFound if it is not registered)."""
        ...

    async def shm_unregister(self, name: str = "") -> None:
        """The region named, or every region; an unknown name is not an error."""
        ...

    # -- CUDA shared memory ----------------------------------------------------------

    async def cuda_shm_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """A client's CUDA IPC handle (the 64 raw bytes); refused, saying why, on a host without CUDA."""
        ...

    async def cuda_shm_status(self, name: str = "") -> list[CudaRegionStatus]:
        """Every CUDA region (no ``name``), or the one named (NotFound if it is not one)."""
        ...

    async def cuda_shm_unregister(self, name: str = "") -> None:
        """The CUDA region named, or every CUDA region; an unknown name is not an error."""
        ...

    # -- tracing and logging ----------------------------------------------------------

    async def trace_settings(self, model: str = "",
                             changes: Mapping[str, list[str]] | None = None) -> dict[str, list[str]]:
        """Apply TraceSetting ``changes`` (an empty list clears one), all or nothing; the
        settings now in force for ``model`` (the global ones for "")."""
        ...

    async def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Apply log setting ``changes``, all or nothing; the settings now in force."""
        ...

    async def kv_cache_blocks(self) -> dict[str, float]:
        """The KV-cache block metrics models registered (``nv_trt_llm_kv_cache_block_metrics``, by its
        ``kv_cache_block_type`` label: ``tokens_per``, ``used``, ``max``; the last series of each, as Triton
        reads /metrics), which an ORCA load report is made of; empty when no model registered them."""
        ...

    # -- inference -----------------------------------------------------------------

    def tracing_on(self) -> bool:
        """Whether a request could be traced now (tracing is on for some model): a frontend builds
        its trace stamps (``InferenceRequest.frontend``) only then. Synchronous and cheap, asked
        on every request; a request racing a change of the settings is merely traced without them."""
        ...

    async def infer(self, request: InferenceRequest, decoupled_error: str = DECOUPLED_UNARY,
                    trace_carrier: TraceCarrier | None = None) -> InferenceResponse:
        """Run one request (refused with UNAVAILABLE while the server drains). Outputs
        requested into shared memory are written there (the frontend sends no data for
        them). ``decoupled_error``: the frontend's words refusing a decoupled model."""
        ...

    # -- batch jobs (inferd.batchjobs) ---------------------------------------------------

    async def batch_submit(self, data: bytes, model: str, version: int = 0) -> dict[str, Any]:
        """Start a job over ``data`` (JSONL: one KServe v2 request per line, each with a
        ``custom_id``); its document (``id``, ``status``, ``request_counts``, ...)."""
        ...

    async def batch_list(self) -> list[dict[str, Any]]: ...

    async def batch_status(self, job_id: str) -> dict[str, Any]: ...

    async def batch_cancel(self, job_id: str) -> dict[str, Any]:
        """Stop a job (its results so far stay); its document."""
        ...

    async def batch_results(self, job_id: str, fmt: str = "jsonl") -> bytes:
        """The job's results so far: JSONL (one per custom id) or NPZ."""
        ...

    def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        """Run one request of a stream and yield its responses as they come: one, or a
        decoupled model's many, then the final flag. Errors are yielded (a drain's
        refusal too); only cancellation raises."""
        ...


@runtime_checkable
class GrpcFastPath(Protocol):
    """What a data plane may offer gRPC ModelInfer besides :class:`DataPlaneAPI`: the whole call on
    the wire's own messages. A frontend worker's data plane offers it (its core decodes the
    tensors in place in the hand-off's arena, so the worker builds no numpy array); the
    in-process :class:`~inferd.dataplane.plane.DataPlane` does not (its servicer decodes).
    The servicer asks once, when it is built (``isinstance``)."""

    async def grpc_infer(self, message: Any, deadline: float | None, trace_carrier: TraceCarrier | None,
                         received_ns: int) -> Any:
        """A ``ModelInferRequest`` in, its ``ModelInferResponse`` out (both opaque here, as
        :meth:`DataPlaneAPI.model_config`'s message is); refusals and failures raise the domain
        errors, as :meth:`DataPlaneAPI.infer` does. ``deadline``: absolute monotonic seconds, or
        None; ``received_ns``: when the frontend received the call (CLOCK_MONOTONIC ns)."""
        ...


# -- OpenAI's Batch API (/v1/files, /v1/batches) ------------------------------------------------------------

OPENAI_BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")  # what a batch may run
OPENAI_MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's limit for a batch input file (the HTTP body limit may be lower)
OPENAI_UPLOADS = "uploads"  # the folder of the Batch API's directory an upload is written to for the core to take


class OpenAIBatchAPI(Protocol):
    """What the ``/v1/files`` and ``/v1/batches`` routes ask of the core, which owns the batches and
    runs them (:class:`inferd.batchjobs.OpenAIBatches`): the in-process data plane implements it,
    and a frontend worker forwards each call to the core (``inferd.serve.worker_process``). Apart
    from :class:`DataPlaneAPI` because the hand-off's proxy does not carry these calls (yet): the
    worker sends them with its link's own call. Refusals are InvalidArgument (the route knows which
    field each is about), NotFound and TooLarge. Bytes never travel in a call: an upload is written
    into the Batch API's directory (``OPENAI_UPLOADS``) and named, a file's content read from the
    path :meth:`openai_file_content` gives."""

    async def openai_file_create(self, filename: str, purpose: str, upload: str) -> dict[str, Any]:
        """The upload named ``upload`` made a file; its File object."""
        ...

    async def openai_file(self, file_id: str) -> dict[str, Any]: ...

    async def openai_files(self, purpose: str | None) -> dict[str, Any]: ...

    async def openai_file_delete(self, file_id: str) -> dict[str, Any]: ...

    async def openai_file_content(self, file_id: str) -> str:
        """The path of the file's bytes."""
        ...

    async def openai_batch_create(self, input_file_id: str, endpoint: str,
                                  metadata: dict[str, str] | None) -> dict[str, Any]:
        """A batch over an uploaded file (its fields already checked); its Batch object."""
        ...

    async def openai_batch(self, batch_id: str) -> dict[str, Any]: ...

    async def openai_batches(self, after: str | None, limit: int) -> dict[str, Any]: ...

    async def openai_batch_cancel(self, batch_id: str) -> dict[str, Any]: ...


# The calls a frontend worker's /v1 routes make to the core (part of inferd.handoff.messages.CALLS).
OPENAI_BATCH_CALLS = frozenset(name for name, value in vars(OpenAIBatchAPI).items()
                               if callable(value) and not name.startswith("_"))
