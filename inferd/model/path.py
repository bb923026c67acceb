"""One request through one model's own path: validate, schedule, shape, count.

The data plane runs every client request through :func:`run_model`, and an
ensemble runs each of its steps through it too, so a step is validated,
batched, traced and counted exactly as a direct request to that model.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import numpy as np

from inferd.clock import Clock
from inferd.dtypes import encode_bytes
from inferd.errors import DeadlineExceeded, InferdError
from inferd.model.model import Model
from inferd.model.validation import check_requested_outputs, prepare_inputs, shape_outputs
from inferd.types import InferenceRequest, RequestedOutput


async def run_model(
    model: Model, request: InferenceRequest, clock: Clock,
    describe: Callable[[Exception], Exception] | None = None,
) -> dict[str, np.ndarray]:
    """The request's outputs, shaped as the client asked. Records success or
    failure (with its reason) in ``model.stats`` and ends ``request.trace``;
    outputs requested into shared memory are written there. ``describe`` turns
    a failure into the error raised and traced (an ensemble names its step)."""
    spec = model.spec
    stats = model.stats
    trace = request.trace
    start = time.perf_counter_ns()
    try:
        inputs, rows = prepare_inputs(spec, request)
        check_requested_outputs(spec, request.requested_outputs)
        request.inputs = inputs
        if trace is not None:
            trace.set("triton.model_version", model.version)
            trace.tensors_attributes("input", inputs)
        outputs = await model.scheduler.infer(request, rows)
        result = shape_outputs(spec, outputs, request.requested_outputs)
        if request.requested_outputs:
            _write_shared_memory(spec.name, result, request.requested_outputs)
    except BaseException as exc:
        stats.record_failure(time.perf_counter_ns() - start, failure_reason(exc), clock.now())
        error = describe(exc) if describe is not None and isinstance(exc, Exception) else exc
        if trace is not None:
            trace.end(error)
        if error is exc:
            raise
        raise error from (None if isinstance(exc, InferdError) else exc)
    stats.record_success(time.perf_counter_ns() - start, clock.now())
    if trace is not None:
        trace.tensors_attributes("output", result)
        trace.end()
    return result


def failure_reason(exc: BaseException) -> str:
    """The reason a failure is counted under (Triton's failure-reason label)."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, DeadlineExceeded):
        return "TIMEOUT"
    if isinstance(exc, InferdError):
        return exc.grpc_code.name
    return "INTERNAL"


def _write_shared_memory(model: str, result: dict[str, np.ndarray], requested: list[RequestedOutput]) -> None:
    for r in requested:
        ref = r.shared_memory
        if ref is not None:
            array = result[r.name]
            ref.write(encode_bytes(array) if array.dtype.kind in "OSU" else array,
                      f"output '{r.name}' for model '{model}'")
