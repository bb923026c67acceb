"""One request through one model's own path: validate, schedule, shape, count.

The data plane runs every client request through :func:`run_model` (one
response) or :func:`stream_model` (a stream's request: one response, or a
decoupled model's many), and an ensemble runs each of its steps through
:func:`run_model` too, so a step is validated, batched, traced and counted
exactly as a direct request to that model. Both take the same steps
(:func:`_admit`, :func:`_shape`, :func:`_record_failure`); only how the
outputs come back differs.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Callable

import numpy as np

from inferd.clock import Clock
from inferd.dtypes import encode_bytes
from inferd.errors import DeadlineExceeded, InferdError, ModelExecutionError, SloRefused
from inferd.gpu.tensor import DeviceTensor
from inferd.model.cache import ResponseCache, request_key
from inferd.model.model import Model
from inferd.model.validation import check_requested_outputs, prepare_inputs, shape_outputs
from inferd.streaming import ResponseSink, StreamEvent, StreamResponse
from inferd.types import InferenceRequest, InferenceResponse, RequestedOutput


async def run_model(
    model: Model, request: InferenceRequest, clock: Clock,
    describe: Callable[[Exception], Exception] | None = None,
) -> dict[str, np.ndarray]:
    """The request's outputs, shaped as the client asked. Records success or
    failure (with its reason) in ``model.stats`` and ends ``request.trace``;
    outputs requested into shared memory are written there. ``describe`` turns
    a failure into the error raised and traced (an ensemble names its step)."""
    start = time.perf_counter_ns()
    hit_ns = -1  # a response cache hit: the time finding it took
    try:
        rows = _admit(model, request)
        if model.cache is None:
            outputs = await model.scheduler.infer(request, rows)
        else:
            outputs, hit_ns = await _cached(model, model.cache, request, rows)
        result = _shape(model, outputs, request)
    except BaseException as exc:
        error = describe(exc) if describe is not None and isinstance(exc, Exception) else exc
        _record_failure(model, request, clock, start, exc, error)
        if error is exc:
            raise
        raise error from (None if isinstance(exc, InferdError) else exc)
    if hit_ns < 0:
        model.stats.record_success(time.perf_counter_ns() - start, clock.now())
    else:
        model.stats.record_cache_hit(time.perf_counter_ns() - start, hit_ns, clock.now())
    trace = request.trace
    if trace is not None:
        trace.tensors_attributes("output", result)
        trace.end()
    return result


async def _cached(model: Model, cache: ResponseCache, request: InferenceRequest,
                  rows: int) -> tuple[dict[str, np.ndarray], int]:
    """The model's outputs for ``request``: from the response cache (and the time the hit
    took), or computed, kept there and -1 (the miss's lookup and insertion are counted).
    As in Triton, only host tensors are cached: a request with an input on a device
    bypasses the cache, and outputs left on a device are not kept."""
    if not all(isinstance(a, np.ndarray) for a in request.inputs.values()):
        return await model.scheduler.infer(request, rows), -1
    t0 = time.perf_counter_ns()
    key = request_key(model.spec.name, model.version, request)
    outputs = cache.lookup(key)
    if outputs is not None:
        return outputs, time.perf_counter_ns() - t0
    lookup_ns = time.perf_counter_ns() - t0
    outputs = await model.scheduler.infer(request, rows)
    t1 = time.perf_counter_ns()
    if all(isinstance(a, np.ndarray) for a in outputs.values()):
        cache.insert(key, outputs)
    model.stats.record_cache_miss(lookup_ns + time.perf_counter_ns() - t1)
    return outputs, -1


async def stream_model(model: Model, request: InferenceRequest, clock: Clock) -> AsyncIterator[StreamResponse]:
    """Every response to one request, as it comes (ModelStreamInfer).

    A plain model gives one response, final. A decoupled model gives what its
    code sends through the request's :class:`ResponseSink`: zero or more
    responses (or errors), then the final flag (on the last response, or
    alone); the request is counted once, when it ends, as failed under its
    first error's reason. Errors are yielded, as final responses where they
    end the request; only cancellation (or a bug) raises.
    """
    if not model.decoupled:
        try:
            result = await run_model(model, request, clock)
        except InferdError as exc:
            yield StreamResponse(error=exc, final=True)
            return
        yield StreamResponse(response=response(model, request, result), final=True)
        return
    start = time.perf_counter_ns()
    try:
        rows = _admit(model, request)
    except InferdError as exc:
        _record_failure(model, request, clock, start, exc, exc)
        yield StreamResponse(error=exc, final=True)
        return
    loop = asyncio.get_running_loop()
    sink = ResponseSink(loop)
    request.responder = sink
    task = loop.create_task(model.scheduler.infer(request, rows))
    name = model.spec.name

    def executed(t: asyncio.Task) -> None:
        # The request never reached the model (refused, queue full, ...): that ends it.
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            error = exc if isinstance(exc, InferdError) else ModelExecutionError(
                f"model '{name}' failed to execute: {type(exc).__name__}: {exc}")
            sink.put(StreamEvent(error=error, final=True))

    task.add_done_callback(executed)
    failure: InferdError | None = None
    try:
        while True:
            event = await sink.get()
            if event.error is not None:
                failure = failure or event.error
                yield StreamResponse(error=event.error, final=event.final)
            elif event.outputs is not None:
                try:
                    result = _shape(model, event.outputs, request)
                except InferdError as exc:
                    failure = failure or exc
                    yield StreamResponse(error=exc, final=event.final)
                else:
                    yield StreamResponse(response=response(model, request, result), final=event.final)
            else:
                yield StreamResponse(final=True)
            if event.final:
                break
    except BaseException as exc:  # cancelled, or the consumer closed the stream
        request.cancelled = sink.cancelled = True
        if not task.done():
            task.cancel()
        _record_failure(model, request, clock, start, asyncio.CancelledError(), exc)
        raise
    if failure is not None:
        _record_failure(model, request, clock, start, failure, failure)
    else:
        model.stats.record_success(time.perf_counter_ns() - start, clock.now())
        if request.trace is not None:
            request.trace.end()


def _admit(model: Model, request: InferenceRequest) -> int:
    """Validate the request against the model; its inputs in the model's shapes; its batch size."""
    spec = model.spec
    inputs, rows = prepare_inputs(spec, request)
    check_requested_outputs(spec, request.requested_outputs)
    if model.tensor_device is None:
        # Device tensors (a CUDA shared memory input, a step's output kept on its GPU) reach only
        # models that take torch tensors; anything else gets them copied to the host, once.
        for name, value in inputs.items():
            if isinstance(value, DeviceTensor):
                inputs[name] = value.to_host()
    request.inputs = inputs
    trace = request.trace
    if trace is not None:
        trace.set("triton.model_version", model.version)
        trace.tensors_attributes("input", inputs)
    return rows


def _shape(model: Model, outputs: dict[str, np.ndarray], request: InferenceRequest) -> dict[str, np.ndarray]:
    """One response's outputs as the client asked for them; those requested into shared memory written there."""
    requested = request.requested_outputs
    result = shape_outputs(model.spec, outputs, requested)
    if request.output_device is None:
        for name, value in result.items():
            if isinstance(value, DeviceTensor):  # an ensemble's input handed straight out, say
                result[name] = value.to_host()
    if requested:
        _write_shared_memory(model.spec.name, result, requested)
    return result


def _record_failure(model: Model, request: InferenceRequest, clock: Clock, start: int,
                    cause: BaseException, error: BaseException) -> None:
    """Count the failure under ``cause``'s reason; end the trace with ``error``."""
    model.stats.record_failure(time.perf_counter_ns() - start, failure_reason(cause), clock.now())
    if request.trace is not None:
        request.trace.end(error)


def response(model: Model, request: InferenceRequest, outputs: dict[str, np.ndarray]) -> InferenceResponse:
    """The response carrying ``outputs`` (as :func:`run_model` returns them) for ``request``."""
    return InferenceResponse(model_name=model.spec.name, model_version=model.version, outputs=outputs, id=request.id)


def failure_reason(exc: BaseException) -> str:
    """The reason a failure is counted under (Triton's failure-reason label)."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, DeadlineExceeded):
        return "TIMEOUT"
    if isinstance(exc, SloRefused):
        return SloRefused.reason
    if isinstance(exc, InferdError):
        return exc.kind
    return "INTERNAL"


def _write_shared_memory(model: str, result: dict[str, np.ndarray], requested: list[RequestedOutput]) -> None:
    for r in requested:
        ref = r.shared_memory
        if ref is not None:
            array = result[r.name]
            ref.write(encode_bytes(array) if array.dtype.kind in "OSU" else array,
                      f"output '{r.name}' for model '{model}'")
