"""The protocol-neutral request and response that every layer below the
frontends speaks. Plain data: numpy arrays, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class RequestedOutput:
    name: str
    class_count: int = 0  # > 0: the classification extension's top-k
    parameters: dict[str, Any] = field(default_factory=dict)
    shared_memory: Any = None  # a ShmRef: the data plane writes the result there, not in the response


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
    trace: Any = None  # a tracing context, when tracing is on
    # Stateful sequences: set by the sequence batcher from the request's
    # sequence_id / sequence_start / sequence_end parameters (pb_utils reads them).
    correlation_id: int | str = 0
    flags: int = 0  # 1: sequence start, 2: sequence end (TRITONSERVER_REQUEST_FLAG_*)
    # Batch-job work (inferd.batchjobs): it runs only on capacity that
    # interactive requests leave idle (inferd.scheduling.background).
    background: bool = False
    # A decoupled model's responses go here (an inferd.streaming.ResponseSink,
    # set by DataPlane.infer_stream); None for one-response requests.
    responder: Any = None


@dataclass(slots=True, eq=False)
class InferenceResponse:
    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
