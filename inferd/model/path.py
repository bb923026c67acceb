"""One request through one model's own path: validate, schedule, shape, count.

The data plane runs every client request through :func:`submit_model` (one
response, through a callback: no task or coroutine per request) or
:func:`stream_model` (a stream's request: one response, or a decoupled model's
many), and an ensemble runs each of its steps through :func:`run_model`
(:func:`submit_model` awaited), so a step is validated, batched, traced and
counted exactly as a direct request to that model. A request's one
:class:`ModelRun` is the completion its scheduler resolves: nothing else wraps
it on the way. All take the same steps (:func:`_admit`, :func:`_shape`,
:func:`_record_failure`).
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
from inferd.model.loaded import Model
from inferd.model.validation import check_requested_outputs, prepare_inputs, shape_outputs
from inferd.streaming import ResponseSink, StreamEvent, StreamLimits, StreamResponse
from inferd.types import InferenceRequest, InferenceResponse, RequestedOutput


class ModelRun:
    """One request on its model's path, answered through a callback (no task awaits it).

    Made by :func:`submit_model`; the scheduler resolves it as it would a future
    (``set_result`` / ``set_exception``). Once the request ends, its statistics
    are recorded, its trace is ended, :attr:`outputs` (shaped as the client asked,
    those requested into shared memory written there) or :attr:`error` is set and
    ``on_done(run)`` is called, once, on the loop (maybe before :func:`submit_model`
    returns). It is the one object the request is completed through: its scheduler resolves it
    directly, with no relay of its own between them.
    :meth:`cancel` ends it early, counted as cancelled, ``on_done`` still called.
    """

    __slots__ = ("model", "request", "clock", "describe", "on_done", "start", "finished", "outputs", "error",
                 "hit_ns", "_cancel")

    def __init__(self, model: Model, request: InferenceRequest, clock: Clock, on_done: Callable[["ModelRun"], None] | None,
                 describe: Callable[[Exception], Exception] | None) -> None:
        self.model = model
        self.request = request
        self.clock = clock
        self.describe = describe
        self.on_done = on_done
        self.start = time.perf_counter_ns()
        self.finished = False
        self.outputs: dict[str, np.ndarray] | None = None
        self.error: BaseException | None = None
        self.hit_ns = -1  # a response cache hit: the time finding it took
        self._cancel: Callable[[], None] | None = None

    def done(self) -> bool:
        return self.finished

    def set_result(self, result: dict[str, np.ndarray]) -> None:
        """The scheduler's outputs for the request."""
        if self.finished:
            return
        model, request = self.model, self.request
        try:
            outputs = _shape(model, result, request)
        except BaseException as exc:
            self.set_exception(exc)
            return
        self.finished = True
        self._cancel = None  # nothing to cancel any more
        self.outputs = outputs
        stats = model.stats
        elapsed = time.perf_counter_ns() - self.start
        if self.hit_ns < 0:
            stats.record_success(elapsed, self.clock.now(), request.members)
        else:
            stats.record_cache_hit(elapsed, self.hit_ns, self.clock.now())
        if stats.first_response:
            stats.record_first_response(elapsed, request.members)
        trace = request.trace
        if trace is not None:
            trace.tensors_attributes("output", outputs)
            trace.end()
        on_done, self.on_done = self.on_done, None  # _tell, written out: once per request
        if on_done is not None:
            on_done(self)

    def set_exception(self, exception: BaseException) -> None:
        """The request failed: counted under its reason; ``describe`` says what the caller sees."""
        if self.finished:
            return
        self.finished = True
        self._cancel = None
        describe = self.describe
        error = describe(exception) if describe is not None and isinstance(exception, Exception) else exception
        _record_failure(self.model, self.request, self.clock, self.start, exception, error)
        stats = self.model.stats
        if stats.first_response and not isinstance(exception, asyncio.CancelledError):
            stats.record_first_response(time.perf_counter_ns() - self.start, self.request.members)  # the client's answer
        if error is not exception:
            if isinstance(exception, InferdError):
                error.__suppress_context__ = True
            else:
                error.__cause__ = exception
        self.error = error
        self._tell()

    def _tell(self) -> None:
        """Call ``on_done``, once, and let go of it: whoever it wakes may keep this run (an awaiting
        caller's future has it as its result), which would otherwise make a reference cycle."""
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done(self)

    def cancel(self) -> None:
        """The caller has gone: drop the request if it has not started (one that has runs on,
        its outcome ignored). The run ends now, counted as cancelled: ``on_done`` sees a
        CancelledError as its :attr:`error`."""
        if self.finished:
            return
        self.finished = True
        self.request.cancelled = True
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()
        cancelled = asyncio.CancelledError()
        _record_failure(self.model, self.request, self.clock, self.start, cancelled, cancelled)
        self.error = cancelled
        self._tell()


def submit_model(model: Model, request: InferenceRequest, clock: Clock, on_done: Callable[[ModelRun], None],
                 describe: Callable[[Exception], Exception] | None = None, more: bool = False) -> ModelRun:
    """Start ``request`` on its model's path: validate, then hand it to the scheduler
    (``more``: other requests follow in this loop turn). See :class:`ModelRun`; a request
    refused on the way is answered (``on_done``) before this returns."""
    run = ModelRun(model, request, clock, on_done, describe)
    try:
        rows = _admit(model, request)
        if model.cache is None:
            run._cancel = model.scheduler.submit(request, rows, run, more)
        else:
            run._cancel = asyncio.get_running_loop().create_task(_run_cached(run, rows)).cancel
    except BaseException as exc:
        # Its traceback holds this frame and the schedulers' (each holding the run, which now
        # holds the error): a reference cycle per refused request, left to the oldest
        # generation's rare collections. Nothing reads it: the caller answers kind and message.
        run.set_exception(exc.with_traceback(None))
    return run


async def run_model(
    model: Model, request: InferenceRequest, clock: Clock,
    describe: Callable[[Exception], Exception] | None = None,
) -> dict[str, np.ndarray]:
    """:func:`submit_model` for a caller that awaits: the request's outputs, shaped as the client
    asked (those requested into shared memory written there), or its error raised; recorded in
    ``model.stats`` and ``request.trace`` as the run records them. ``describe`` turns a failure
    into the error raised and traced (an ensemble names its step). Cancelling the awaiting task
    cancels the request."""
    future: asyncio.Future = asyncio.get_running_loop().create_future()
    run = submit_model(model, request, clock, lambda _: future.done() or future.set_result(None), describe)
    if not run.finished:
        try:
            await future
        except asyncio.CancelledError:
            run.cancel()
            raise
    if run.error is not None:
        raise run.error
    assert run.outputs is not None
    return run.outputs


async def _run_cached(run: ModelRun, rows: int) -> None:
    """submit_model's path for a model with a response cache: the lookup and insertion
    around the scheduler need a coroutine, so a cached model's request gets a task."""
    assert run.model.cache is not None
    try:
        result, run.hit_ns = await _cached(run.model, run.model.cache, run.request, rows)
    except BaseException as exc:
        run.set_exception(exc)
    else:
        run.set_result(result)


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


async def stream_model(model: Model, request: InferenceRequest, clock: Clock,
                       limits: StreamLimits | None = None) -> AsyncIterator[StreamResponse]:
    """Every response to one request, as it comes (ModelStreamInfer).

    A plain model gives one response, final. A decoupled model gives what its
    code sends through the request's :class:`ResponseSink` (bounded by
    ``limits``): zero or more responses (or errors), then the final flag (on the
    last response, or alone); the request is counted once, when it ends, as
    failed under its first error's reason, and each response under its index
    (``response_stats``). The request's statistics are recorded before its final
    response is yielded, so a consumer that stops there (the hand-off's core does)
    has a success counted, not a cancellation. Errors are yielded, as final
    responses where they end the request; only cancellation (or a bug) raises, and
    a cancellation reaches the model (``request.cancelled``, the sink refuses more).
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
        if model.stats.first_response:
            model.stats.record_first_response(time.perf_counter_ns() - start)
        yield StreamResponse(error=exc, final=True)
        return
    loop = asyncio.get_running_loop()
    sink = ResponseSink(loop, limits, model.spec.name, request)
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
    counter = _ResponseCounter(model, sink, start)
    failure: InferdError | None = None
    ended = False
    try:
        while not ended:
            event = await sink.get()
            if event.error is not None:
                failure = failure or event.error
                item = StreamResponse(error=event.error, final=event.final)
            elif event.outputs is not None:
                try:
                    result = _shape(model, event.outputs, request)
                except InferdError as exc:
                    failure = failure or exc
                    item = StreamResponse(error=exc, final=event.final)
                else:
                    item = StreamResponse(response=response(model, request, result), final=event.final)
            else:
                item = StreamResponse(final=True)
            counter.count(event, item)
            if event.final:
                ended = True
                _record_end(model, request, clock, start, failure)
            yield item
    except BaseException as exc:  # cancelled, or the consumer closed the stream
        if ended:  # closed after its final response: already counted
            raise
        sink.cancel()
        if not task.done():
            task.cancel()
        if request.ended_by_client:  # the consumer has all it wants (an OpenAI stop string): not a cancellation
            _record_end(model, request, clock, start, failure)
        else:
            counter.cancelled()
            _record_failure(model, request, clock, start, asyncio.CancelledError(), exc)
        raise


class _ResponseCounter:
    """A decoupled request's responses in ``response_stats``, by index, as Triton counts
    them: each response's span runs from the previous one's end (the first's from the
    moment its request reached the model) to its own, split at the moment the model
    sent it (compute_infer before, compute_output after: the server's shaping)."""

    __slots__ = ("stats", "sink", "index", "last_ns", "start")

    def __init__(self, model: Model, sink: ResponseSink, start: int) -> None:
        self.stats = model.stats
        self.sink = sink
        self.index = 0
        self.last_ns = 0
        self.start = start  # when the request reached the model's path: its time to first response

    def count(self, event: StreamEvent, item: StreamResponse) -> None:
        now = time.perf_counter_ns()
        begin = self.last_ns or self.sink.started_ns or event.sent_ns
        sent = min(max(event.sent_ns, begin), now)
        if item.error is not None:
            kind = "fail"
        elif item.response is not None:
            kind = "success"
        else:
            kind = "empty"
        self.stats.record_response(self.index, kind, sent - begin, now - sent)
        if self.index == 0 and self.stats.first_response:
            self.stats.record_first_response(now - self.start)
        self.index += 1
        self.last_ns = now

    def cancelled(self) -> None:
        now = time.perf_counter_ns()
        begin = self.last_ns or self.sink.started_ns or now
        self.stats.record_response(self.index, "cancel", now - begin, 0)


def _record_end(model: Model, request: InferenceRequest, clock: Clock, start: int,
                failure: InferdError | None) -> None:
    """A decoupled request's end: one success, or one failure under its first error's reason."""
    if failure is not None:
        _record_failure(model, request, clock, start, failure, failure)
        return
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
    model.stats.record_failure(time.perf_counter_ns() - start, failure_reason(cause), clock.now(), request.members)
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
