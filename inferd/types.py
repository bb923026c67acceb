"""The protocol-neutral request and response that every layer below the
frontends speaks. Plain data: numpy arrays, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from inferd.dtypes import DataType


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a tensor lies in a registered system shared memory region, as the
    request names it (``shared_memory_region`` / ``_offset`` / ``_byte_size``).
    The frontend only checks the parameters; the data plane, which holds the
    regions, finds the region and checks the window (``where`` names the tensor)."""

    region: str
    offset: int
    byte_size: int
    where: str


@dataclass(frozen=True, slots=True)
class SharedTensor:
    """An input whose data is in shared memory: it stands in ``InferenceRequest.inputs``
    until the data plane reads it from the region (``InferenceRequest.shared_memory``)."""

    ref: ShmRef
    datatype: DataType
    shape: tuple[int, ...]


@dataclass(slots=True)
class RequestedOutput:
    name: str
    class_count: int = 0  # > 0: the classification extension's top-k
    parameters: dict[str, Any] = field(default_factory=dict)
    # A ShmRef from the frontend, bound to its region by the data plane: the result
    # is written there, not sent in the response.
    shared_memory: Any = None


@dataclass(slots=True, eq=False)
class FrontendStamps:
    """A gRPC or HTTP request's own moments, for Triton's frontend trace timestamps
    (GRPC_WAITREAD_START/END and GRPC_SEND_START/END; HTTP_RECV_START/END and HTTP_SEND_START/END):
    CLOCK_MONOTONIC nanoseconds, one clock for every process of a host.

    The frontend stamps the receive side when it builds the request and calls :meth:`sent` once,
    on every path, when its answer is handed to the transport. Whoever holds the request's trace
    sets ``on_sent`` (the data plane, for a sampled request; a frontend worker's proxy, which
    forwards the stamps to the core); unsampled, it stays None and :meth:`sent` costs nothing."""

    protocol: str  # "grpc" or "http"
    recv_start_ns: int
    recv_end_ns: int
    on_sent: Callable[[int | None, int | None], None] | None = None

    def sent(self, start_ns: int | None, end_ns: int | None) -> None:
        """The answer was sent between these moments (None: it never was: the trace ends without them)."""
        on_sent, self.on_sent = self.on_sent, None
        if on_sent is not None:
            on_sent(start_ns, end_ns)


@dataclass(slots=True, eq=False)
class InferenceRequest:
    """One client request, decoded once by a frontend.

    ``deadline`` is an absolute time on the server's monotonic clock (the
    client's gRPC deadline), or None. ``timeout_us`` is the protocol's
    ``timeout`` parameter; 0 means the queue policy's default.
    """

    model_name: str
    inputs: dict[str, np.ndarray]
    model_version: int = 0  # 0: as the version policy chooses (the latest ready)
    id: str = ""
    requested_outputs: list[RequestedOutput] | None = None  # None: every output
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0  # 0: the model's default level
    timeout_us: int = 0
    deadline: float | None = None
    cancelled: bool = False  # set by the frontend when the client goes away
    # Set by a stream's consumer that stops reading on purpose, with all it wants (an OpenAI stop
    # string): the request then ends as a success, not a cancellation (a worker says so in CANCEL).
    ended_by_client: bool = False
    trace: Any = None  # a tracing context, when tracing is on
    # Stateful sequences: set by the sequence batcher from the request's
    # sequence_id / sequence_start / sequence_end parameters (pb_utils reads them).
    correlation_id: int | str = 0
    flags: int = 0  # 1: sequence start, 2: sequence end (TRITONSERVER_REQUEST_FLAG_*)
    # Batch-job work (inferd.batchjobs): it runs only on capacity that
    # interactive requests leave idle (inferd.scheduling.background).
    background: bool = False
    # Some input is a SharedTensor or some requested output has a ShmRef: the
    # data plane resolves them against its registered regions before the model runs.
    shared_memory: bool = False
    # A decoupled model's responses go here (an inferd.streaming.ResponseSink,
    # set by DataPlane.infer_stream); None for one-response requests.
    responder: Any = None
    # Leave the outputs on this torch device ("cuda:0"; "cpu"), as DeviceTensors, when the model runs
    # there: an ensemble sets it for a step whose consumers run on that device too. None: host numpy.
    output_device: str | None = None
    # When its frontend received it: CLOCK_MONOTONIC nanoseconds (time.monotonic_ns(), one clock for
    # every process of a host, the base of MonotonicClock.now() in seconds); 0: not stamped (an
    # in-process call), its wait starts when the data plane or scheduler sees it. Queue timeouts, the
    # SLO and the queue-delay controller count the whole wait from here.
    received_ns: int = 0
    # Set only by the /v1 layer (inferd.frontends.openai), never from a client's parameters: the prompt's
    # tokens this request carries (one choice of each prompt carries them, the others 0). The core
    # counts them and the tokens of its responses at /metrics (inferd_openai_*_tokens_total). None: not /v1.
    openai_prompt_tokens: int | None = None
    # Set by the data plane while the server sheds (inferd.dataplane.shedding): still queued past this
    # time (clock seconds), the request is shed UNAVAILABLE by its queue. None: no bound.
    shed_at: float | None = None
    # When its scheduler handed it to an instance (clock seconds; 0.0: not by a BatchScheduler); the
    # data plane reads it as the request ends to feed the controller its queueing delay.
    dispatched: float = 0.0
    # Nanoseconds it waited for its model to load (--model-control-mode on_demand): a cold start, not
    # queueing, so the queue-delay controller leaves it out (its timeout and deadline still count it).
    load_wait_ns: int = 0
    # Set by the gRPC / HTTP frontends (unary inference): their receive and send moments, written to a
    # sampled request's Triton trace. None for every other request (streams, ensemble steps, BLS).
    frontend: FrontendStamps | None = None
    # The client requests this one stands for: an ensemble's step carrying several of the ensemble's
    # requests concatenated (inferd/ensemble/grouping.py) counts as that many in its model's statistics.
    members: int = 1


@dataclass(slots=True, eq=False)
class InferenceResponse:
    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
