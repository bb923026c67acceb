"""The asyncio driver around :class:`BatchQueue`: one per model version.

It owns the model's instance workers. It steps the queue when a request
arrives, when an instance frees up and when the deadline the queue asked for
comes; it never polls. Requests arriving in the same event-loop tick are
stepped together, so they can share a batch even with no queue delay.

Waiting for the rest of the tick costs a request two loop turns. When it
stops paying (the requests of a tick keep arriving alone, as unary gRPC calls
mostly do) a request finding a free inline instance runs at once, and only
every ``DEFER_PROBE_EVERY``-th one still waits, to notice when requests start
arriving together again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from functools import partial
from typing import Callable

import numpy as np

from inferd.backends.base import BatchResult, RequestInputs
from inferd.clock import Clock
from inferd.errors import InferdError, InvalidArgument, ModelExecutionError, Unavailable
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import Completion, PumpedScheduler, run_task
from inferd.scheduling.instances import InstanceWorker
from inferd.scheduling.adaptive import ADAPTIVE, Instance
from inferd.scheduling.policy import BatchingPolicy
from inferd.scheduling.queue import BatchQueue, Pending, split_rows
from inferd.types import InferenceRequest


# Deferred steps in a row that found their request alone before the idle
# fast path stops waiting for the rest of the tick; then one request in this
# many still waits (a probe): one that finds company resumes waiting.
DEFER_MISSES = 16
DEFER_PROBE_EVERY = 16
# A busy instance takes its next (complete) batch once this share of its expected execution time
# has passed: assembled while it still executes, the batch starts as soon as it ends, and requests
# arriving in the first part of an execution (a higher priority one, say) can still be in it.
STAGE_AT = 0.75
# A model's only instance in a model host takes the batches its queue holds ready in one hand-over (a
# train: one message, one wake-up of the host), while their expected execution time stays within
# TRAIN_WINDOW_S and at most TRAIN_MAX of them: a request arriving meanwhile, of any priority, waits
# behind at most that much.
TRAIN_MAX = 8
TRAIN_WINDOW_S = 0.001


class _Job:
    """What the driver keeps for a queued request: the request and the completion its caller
    handed :meth:`BatchScheduler.submit` (an asyncio.Future, a ModelRun); None once the caller
    withdrew it (then it has left the in-flight count, and nothing answers it)."""

    __slots__ = ("request", "completion", "enqueued", "traced_ns")

    def __init__(self, request: InferenceRequest, completion: Completion, enqueued: float) -> None:
        self.request = request
        self.completion: Completion | None = completion
        self.enqueued = enqueued
        # A traced request's wall-clock time (ns) when queued, then when dispatched.
        self.traced_ns = time.time_ns() if request.trace is not None else 0


class _Batch:
    __slots__ = ("items", "rows", "requests", "result", "traced", "instance", "dispatched")

    def __init__(self, items: list[Pending], rows: int, requests: int, traced: bool = False, instance: str = "",
                 dispatched: float = 0.0) -> None:
        self.items = items
        self.rows = rows
        self.requests = requests  # what the statistics count: the items' members
        self.result: BatchResult | BaseException | None = None
        self.traced = traced  # some request of the batch is traced
        self.instance = instance
        self.dispatched = dispatched  # when it was handed to its instance (maybe still executing another)


class BatchScheduler(PumpedScheduler):
    policy: BatchingPolicy

    def __init__(
        self,
        model: str,
        policy: BatchingPolicy,
        workers: list[InstanceWorker],
        output_names: list[str],
        stats: ModelStats,
        clock: Clock | None = None,
        joins_rows: bool = False,
    ) -> None:
        super().__init__(model, policy, workers, output_names, stats, clock)
        # Its backend joins a batch's requests into one tensor per input (Backend.joins_batches): a
        # request that arrives with several requests' rows concatenated is what its batch would be.
        self._joins_rows = joins_rows
        self._free: deque[InstanceWorker] = deque(workers)
        self._queue = BatchQueue(policy, model)
        self._bound_s = policy.max_queue_delay_s
        self._defer_misses = 0  # deferred steps in a row that found their request alone
        self._defer_probe = 0
        self._ordered: deque[_Batch] | None = deque() if policy.preserve_ordering else None
        self._plain_groups = policy.grouping.plain  # read per request: the property's call, once
        # Trains (TRAIN_MAX) for a lone remote instance only: with several, a batch handed to a busy one
        # would wait while another may free up first (scheduling/instances.py).
        self._trains = len(workers) == 1 and workers[0].trains

    # -- Scheduler ---------------------------------------------------------

    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """:meth:`Scheduler.submit`: admission, then the queue or the idle fast path, with no task,
        coroutine or wrapper per request; the batch resolves ``completion`` itself. The request is
        in flight from here until it is answered, expires, or its caller withdraws it."""
        if self._must_split(rows):
            return run_task(self._infer_split(request, rows), completion)  # several executions, rare
        background = request.background
        self._inflight.enter(background)
        try:
            item = self._enqueue(request, rows, completion, more)
        except BaseException:
            self._inflight.leave(background)  # nothing was queued
            raise
        if item is None:  # run at once, answered already
            self._inflight.leave(background)
            return _ended
        return partial(self._withdraw, item)

    def _withdraw(self, item: Pending) -> None:
        """A caller's cancel: the request leaves now, dropped from the queue if it has not started; one
        executing runs on, and its batch answers nobody for it."""
        if self._inflight.withdraw(item.payload):
            self._queue.cancel(item)

    def _must_split(self, rows: int) -> bool:
        """Raise what refuses a request before it is queued; whether it must be split."""
        if self._stopped:
            raise Unavailable(f"model '{self.model}' is unloading and takes no new requests")
        p = self.policy
        if p.max_batch_size > 0 and rows > p.max_batch_size:
            if not p.split_large_requests:
                raise InvalidArgument(
                    f"model '{self.model}': inference request batch-size must be <= {p.max_batch_size}, "
                    f"got {rows} (set parameter inferd.split_large_requests to split larger requests)"
                )
            return True
        return False

    def _enqueue(self, request: InferenceRequest, rows: int, completion: Completion, more: bool) -> Pending | None:
        """Queue the request for ``completion`` (and step the queue, or arrange to), or run it at
        once on the idle fast path and resolve ``completion`` before returning None."""
        loop = asyncio.get_running_loop()
        free = self._free
        p = self.policy
        group = None
        if p.batching and not self._plain_groups:
            # Refuses a request no batch could hold (too long for the buckets or the
            # budget), on the fast path too.
            group = p.grouping.describe(self.model, request.inputs, rows)
        if (not more and not self._queue.size and free and free[0].inline and free[0].ticket is None
                and request.trace is None and not self._ordered and not p.slo_us and self._alone(loop, free[0], rows)):
            # The idle fast path: nothing is queued, a free instance executes
            # inline, no other request follows in this loop turn (``more``), and
            # none is expected to join this one's batch (see _alone). Run it now,
            # with none of the queue's bookkeeping; what a client sees (results,
            # errors, statistics) is the same.
            try:
                outputs = self._run_now(free.popleft(), request, rows, time.perf_counter_ns())
            except Exception as exc:
                completion.set_exception(exc)
            else:
                completion.set_result(outputs)
            return None
        if group is None:
            group = p.grouping.describe(self.model, request.inputs, rows) if p.batching else (None, 0)
        key, length = group
        now = self._clock.now()
        item = Pending(
            rows,
            key,
            length=length,
            priority=request.priority,
            timeout_us=request.timeout_us,
            deadline=request.deadline,
            payload=_Job(request, completion, now),
            received=request.received_ns * 1e-9 if request.received_ns else None,
            shed_at=request.shed_at,
        )
        # Raises Unavailable when the queue is full, SloRefused when the SLO cannot be met.
        # Raises DeadlineExceeded / Unavailable when its deadline or timeout cannot be met behind the queue.
        estimates = p.slo_us or request.deadline is not None or request.timeout_us
        self._queue.admit(item, now, self._instances(now) if estimates else ())
        if not self._pump_scheduled:
            if not more and _nothing_else_ready(loop):
                # No other callback is waiting to run this turn, so no other
                # request can join a batch by waiting: step now, and a fast
                # inline model answers before the await, saving two loop turns.
                self._pump()
            else:
                # Let the other requests of this turn arrive first: they can
                # share the batch, with no queue delay configured.
                self._pump_scheduled = True
                loop.call_soon(self._pump)
        return item

    def merges_rows(self) -> int:
        """:meth:`Scheduler.merges_rows`: a dynamic batcher whose batches concatenate their requests (a
        backend that joins them, no padding, buckets or budget) takes what it would batch already joined."""
        p = self.policy
        return p.max_batch_size if self._joins_rows and p.batching and self._plain_groups else 0

    def _alone(self, loop: asyncio.AbstractEventLoop, worker: InstanceWorker, rows: int) -> bool:
        """Whether a request finding the queue empty should run at once. With a queue delay
        and adaptive waits, the queue's own decision says (no company expected); with none,
        when no request could join it this loop turn (nothing else is ready to run, or
        recent turns brought none); a fixed delay always waits for company, as Triton."""
        p = self.policy
        if p.max_queue_delay_us:
            return p.batch_wait == ADAPTIVE and self._queue.lone_runs_now(self._clock.now(), rows, worker.estimate)
        return _nothing_else_ready(loop) or not self._worth_waiting()

    def _instances(self, now: float) -> list[Instance]:
        """Each instance as admission sees it: when it is expected free, how long it takes."""
        return [Instance(w.free_at if w.busy else now, w.estimate) for w in self.workers]

    def _worth_waiting(self) -> bool:
        """Whether to let the rest of this loop turn's requests join this one's batch."""
        p = self.policy
        if not p.batching:
            return False  # one request per execution whatever arrives
        if self._defer_misses < DEFER_MISSES:
            return True
        self._defer_probe += 1
        if self._defer_probe < DEFER_PROBE_EVERY:
            return False
        self._defer_probe = 0
        return True

    def _run_now(self, worker: InstanceWorker, request: InferenceRequest, rows: int, arrived_ns: int) -> dict[str, np.ndarray]:
        stats = self._stats
        stats.record_queue(time.perf_counter_ns() - arrived_ns, request.members)  # the time it took to get here
        start = request.dispatched = self._clock.now()
        try:
            # What execute() gets for a request: its inputs, or the request with them (RequestInputs) when
            # the instance reads the request or its outputs should stay on a device. Written out here and
            # in _dispatch: once per request.
            wants = getattr(worker.instance, "wants_requests", False) or request.output_device
            result = worker.run_inline([RequestInputs(request) if wants else request.inputs], self._outputs)
        finally:
            self._free.append(worker)
        worker.estimate.observe(rows, self._clock.now() - start)
        if isinstance(result, BaseException):
            raise result if isinstance(result, InferdError) else ModelExecutionError(
                f"model '{self.model}' failed to execute: {type(result).__name__}: {result}")
        t = result.times
        stats.record_execution(rows, request.members, t.input_ns, t.infer_ns, t.output_ns)
        if result.real_elements:
            stats.record_padding(result.real_elements, result.pad_elements)
        out = result.outputs[0] if result.outputs else ModelExecutionError(
            f"model '{self.model}' returned no response for its request")
        if isinstance(out, BaseException):
            raise out
        return out

    async def _infer_split(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        """Run a too-large request as several executions; reassemble in order."""
        # In flight as a whole: its parts start on a later loop turn, and
        # stop() must not close the instances before they do.
        self._inflight.enter(request.background, pending=False)
        try:
            return await self._run_split(request, rows)
        finally:
            self._inflight.leave(request.background, pending=False)

    async def _run_split(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        parts = []
        for start, stop in split_rows(rows, self.policy.max_batch_size):
            sub = InferenceRequest(
                model_name=request.model_name,
                inputs={k: v[start:stop] for k, v in request.inputs.items()},
                model_version=request.model_version,
                id=request.id,
                priority=request.priority,
                timeout_us=request.timeout_us,
                deadline=request.deadline,
                trace=request.trace,
                received_ns=request.received_ns,
                shed_at=request.shed_at,
            )
            parts.append(asyncio.ensure_future(self.infer(sub, stop - start)))
        try:
            results = await asyncio.gather(*parts)
        except BaseException:
            # One part failed (or the client left): the others must not run for nobody.
            for part in parts:
                part.cancel()
            raise
        return {name: np.concatenate([r[name] for r in results]) for name in results[0]}


    # -- driving the queue ---------------------------------------------------

    def _pump(self) -> None:
        if self._pump_scheduled:
            # The end of the turn a request waited for: did other requests join it?
            self._pump_scheduled = False
            self._defer_misses = 0 if len(self._queue) > 1 else self._defer_misses + 1
        if self._pumping:
            return
        self._pumping = True
        try:
            self._pump_loop()
        finally:
            self._pumping = False

    def _pump_loop(self) -> None:
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            now = self._clock.now()
            free = self._free
            staging, stage_from = (None, None) if free else self._stageable(now)
            if free:
                step = queue.step(now, True, free[0].estimate)
            elif staging is not None:
                step = queue.step(now, False, staging.estimate, stage_at=max(now, staging.free_at))
            else:
                step = queue.step(now, False)
            for item, error in step.expired:
                self._inflight.answer(item.payload, error)
            if step.batch:
                worker = free.popleft() if free else staging
                assert worker is not None
                if self._trains and len(queue):
                    self._train(worker, step.batch, now, loop)
                else:
                    self._dispatch(worker, step.batch, now, loop)
                continue
            wake = step.wake_at
            if stage_from is not None and len(queue):
                wake = stage_from if wake is None else min(wake, stage_from)
            self._alarm.arm(wake)
            return

    def _train(self, worker: InstanceWorker, first: list[Pending], now: float,
               loop: asyncio.AbstractEventLoop) -> None:
        """Dispatch ``first`` and, behind it, the batches the queue holds that cannot grow (as a staged
        batch is formed), while the train's expected time stays within TRAIN_WINDOW_S: handed to the
        instance together (:meth:`InstanceWorker.hold`)."""
        queue = self._queue
        worker.hold()
        try:
            self._dispatch(worker, first, now, loop)
            for _ in range(TRAIN_MAX - 1):
                # Not behind a batch refused at once (the host's arena full, a failed restart: the worker
                # is free again, and the pump's loop hands it its next batch), nor on a guess (until
                # executions were seen, their time is unknown), nor past the window.
                if (not worker.busy or not len(queue) or not worker.estimate.count
                        or worker.free_at - now > TRAIN_WINDOW_S):
                    return
                step = queue.step(now, False, worker.estimate, stage_at=worker.free_at)
                for item, error in step.expired:
                    self._inflight.answer(item.payload, error)
                if not step.batch:
                    return
                self._dispatch(worker, step.batch, now, loop)
        finally:
            worker.release()

    def _stageable(self, now: float) -> tuple[InstanceWorker | None, float | None]:
        """The busy instance that can take its next batch now, assembled while it still
        executes: one executing on its thread with room behind it, past STAGE_AT of its
        expected execution time. Else (None, when the first one will be: None for none)."""
        ready: InstanceWorker | None = None
        soonest: float | None = None
        for worker in self.workers:
            if not worker.can_stage:
                continue
            if worker.stage_from <= now:
                if ready is None or worker.free_at < ready.free_at:
                    ready = worker
            elif soonest is None or worker.stage_from < soonest:
                soonest = worker.stage_from
        return (ready, None) if ready is not None else (None, soonest)

    def _dispatch(self, worker: InstanceWorker, items: list[Pending], now: float, loop: asyncio.AbstractEventLoop) -> None:
        stats = self._stats
        rows = 0
        requests = 0  # the client requests the batch's stand for (an ensemble's grouped step counts its members)
        inputs = []
        wants_requests = getattr(worker.instance, "wants_requests", False)
        traced = False
        for item in items:
            job = item.payload
            request = job.request
            members = request.members
            requests += members
            stats.record_queue(int((now - job.enqueued) * 1e9), members)
            # Its queueing delay ends (the data plane's controller reads it), less the batching wait the
            # model's config asks for: waiting out max_queue_delay is not overload.
            request.dispatched = now - min(self._bound_s, now - item.arrival)
            rows += item.rows
            # Its inputs, or the request with them (see _run_now)
            inputs.append(RequestInputs(request) if wants_requests or request.output_device else request.inputs)
            if job.traced_ns:
                traced = True
        start = max(now, worker.free_at) if worker.busy else now
        worker.free_at = start + worker.estimate.upper(rows)
        # Unknown until executions were seen: no batch is taken early on a guess.
        worker.stage_from = start + STAGE_AT * worker.estimate.predict(rows) if worker.estimate.count else math.inf
        batch = _Batch(items, rows, requests, traced, worker.name, now)
        if traced:
            _trace_queued(batch)
        if self._ordered is not None:
            self._ordered.append(batch)
        worker.run(inputs, self._outputs, lambda w, result: self._done(w, batch, result), loop)

    def _done(self, worker: InstanceWorker, batch: _Batch, result: BatchResult | BaseException) -> None:
        now = self._clock.now()
        if isinstance(result, BatchResult):
            # A batch handed over behind another started when that one ended, seen here earlier.
            worker.estimate.observe(batch.rows, now - max(batch.dispatched, worker.ended_at))
        worker.ended_at = now
        if not worker.busy:
            self._free.append(worker)
        if isinstance(result, BatchResult):
            t = result.times
            self._stats.record_execution(batch.rows, batch.requests, t.input_ns, t.infer_ns, t.output_ns)
            self._stats.record_memory(result.memory_delta)
            if result.real_elements:
                self._stats.record_padding(result.real_elements, result.pad_elements)
        batch.result = result
        if batch.traced:
            _trace_executed(batch)
        if self._ordered is None:
            self._resolve(batch)
        else:
            # preserve_ordering: answer batches in the order they were dispatched.
            while self._ordered and self._ordered[0].result is not None:
                self._resolve(self._ordered.popleft())
        if not self._pumping:
            self._pump()

    def _resolve(self, batch: _Batch) -> None:
        """Answer each request of an executed batch."""
        result = batch.result
        if isinstance(result, BaseException):
            error = result if isinstance(result, InferdError) else ModelExecutionError(
                f"model '{self.model}' failed to execute: {type(result).__name__}: {result}")
            for item in batch.items:
                self._inflight.answer(item.payload, error)
            return
        assert result is not None
        outputs = result.outputs
        for i, item in enumerate(batch.items):
            out = outputs[i] if i < len(outputs) else ModelExecutionError(
                f"model '{self.model}' returned {len(outputs)} responses for a batch of {len(batch.items)} requests")
            self._inflight.answer(item.payload, out)


def _ended() -> None:
    """The cancel of a request answered before :meth:`BatchScheduler.submit` returned: nothing to drop."""


def _trace_queued(batch: _Batch) -> None:
    now = time.time_ns()
    for item in batch.items:
        job = item.payload
        if job.traced_ns:
            job.request.trace.record("queue", job.traced_ns, now)
            job.traced_ns = now


def _trace_executed(batch: _Batch) -> None:
    now = time.time_ns()
    attributes: dict[str, object] = {"batch_size": batch.rows, "batch_requests": len(batch.items),
                                     "instance": batch.instance}
    if isinstance(batch.result, BaseException):
        attributes["error"] = f"{type(batch.result).__name__}: {batch.result}"
    elif batch.result is not None:  # the backend's own input / infer / output times (Triton's COMPUTE_* split)
        times = batch.result.times
        attributes["input_ns"], attributes["infer_ns"], attributes["output_ns"] = (
            times.input_ns, times.infer_ns, times.output_ns)
    for item in batch.items:
        job = item.payload
        if job.traced_ns:
            job.request.trace.record("compute", job.traced_ns, now, attributes)


def _nothing_else_ready(loop: asyncio.AbstractEventLoop) -> bool:
    # asyncio's own loops keep the callbacks due this turn in ``_ready``; on a
    # loop without it (uvloop) we always defer, which is merely slower.
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready
