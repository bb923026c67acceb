"""The one interface every scheduler implements: plain models and ensembles."""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, Sized

import numpy as np

from inferd.clock import Alarm, Clock, MonotonicClock
from inferd.scheduling.instances import close_workers
from inferd.types import InferenceRequest

if TYPE_CHECKING:
    from inferd.observability.stats import ModelStats
    from inferd.scheduling.instances import InstanceWorker


class Completion(Protocol):
    """What :meth:`Scheduler.submit` resolves: an ``asyncio.Future`` is one."""

    def done(self) -> bool: ...

    def set_result(self, result: dict[str, np.ndarray]) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class Relay:
    """A completion between a scheduler and the completion its caller handed it: on the
    first of the outcome and :meth:`cancel`, :meth:`settle` runs, once; then the outcome goes
    on to ``completion``, or the cancel to :meth:`drop` (by default ``cancel_inner``: the
    cancel of the scheduler this one handed the request to, when it did).

    Once closed it lets go of both (:meth:`forget`): the caller keeps this relay's ``cancel``
    and the inner scheduler keeps this relay as its completion, so each link back is a
    reference cycle per request. Left in place, the cycles of the requests that were in flight
    when a young collection ran reach the oldest generation, whose collections a server's heap
    (a runtime's modules) makes rare: the soak's RSS rose ~40 bytes per request with them."""

    __slots__ = ("completion", "cancel_inner", "open")

    def __init__(self, completion: Completion) -> None:
        self.completion: Completion | None = completion
        self.cancel_inner: Callable[[], None] | None = None
        self.open = True

    def done(self) -> bool:
        return not self.open

    def set_result(self, result: dict[str, np.ndarray]) -> None:
        if self.open:
            self.open = False
            self.settle()
            completion = self.completion
            self.forget()
            assert completion is not None  # open until now
            completion.set_result(result)

    def set_exception(self, exception: BaseException) -> None:
        if self.open:
            self.open = False
            self.settle()
            completion = self.completion
            self.forget()
            assert completion is not None
            completion.set_exception(exception)

    def cancel(self) -> None:
        if self.open:
            self.open = False
            self.settle()
            self.drop()
            self.forget()

    def settle(self) -> None:
        """The request has ended here (answered or cancelled): whatever this scheduler counts."""

    def drop(self) -> None:
        if self.cancel_inner is not None:
            self.cancel_inner()

    def forget(self) -> None:
        """The relay has closed: it holds nothing of the request any more (see the class)."""
        self.completion = None
        self.cancel_inner = None


class Scheduler(abc.ABC):
    @abc.abstractmethod
    async def infer(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        """Run ``request`` (inputs validated, in the model's shapes) and return
        its outputs. ``rows`` is the request's batch size (1 without batching).

        Raises the domain error the client should see. Cancelling the awaiting
        task drops the request if it has not started executing.
        """

    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """:meth:`infer` with no task awaiting it: ``completion`` gets the outputs or the error,
        once, on the loop (maybe before this returns). Returns the cancel: called before the
        completion, it drops the request if it has not started, and the completion is never
        resolved. ``more``: other requests follow in this loop turn (a batcher may hold this
        one for them). May raise what :meth:`infer` would raise before queueing.

        This default runs :meth:`infer` as a task; a scheduler on the hot path admits directly."""
        task = asyncio.get_running_loop().create_task(self.infer(request, rows))

        def finished(t: asyncio.Task) -> None:
            if t.cancelled() or completion.done():
                return
            error = t.exception()
            if error is None:
                completion.set_result(t.result())
            else:
                completion.set_exception(error)

        task.add_done_callback(finished)
        return task.cancel

    @abc.abstractmethod
    def inflight(self) -> int:
        """Requests accepted and not yet answered."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Finish every accepted request, then release the instances."""

    def problem(self) -> str | None:
        """Why the model cannot execute now (every instance failed), or None."""
        return None


def workers_problem(workers: Sequence["InstanceWorker"]) -> str | None:
    """The first instance's reason when every one of ``workers`` has failed (InstanceWorker.failed)."""
    reasons = [w.failed for w in workers]
    return reasons[0] if reasons and all(reasons) else None


class PumpedScheduler(Scheduler):
    """A scheduler of a model's instances driven by one ``_pump`` decision at a time (the dynamic
    batcher, the sequence and the iterative schedulers), and the setup they share: the model's
    name, its policy, its workers and the outputs they compute, its statistics and in-flight
    count, the clock and the alarm that wakes ``_pump`` at the decision's deadline. At most one
    pump is scheduled per loop turn (:meth:`_schedule_pump`); stopping refuses new work, waits
    for what is in flight, disarms the alarm and closes the instances. A subclass sets
    ``_queue`` (whose length is the queue depth) and defines ``_pump``."""

    _queue: Sized

    def __init__(self, model: str, policy: Any, workers: "list[InstanceWorker]", output_names: Sequence[str],
                 stats: "ModelStats", clock: Clock | None = None) -> None:
        if not workers:
            raise ValueError(f"model '{model}': a scheduler needs at least one instance")
        self.model = model
        self.policy = policy
        self.workers = workers
        self._outputs = list(output_names)
        self._stats = stats
        self._clock = clock or MonotonicClock()
        self._alarm = Alarm(self._clock, self._pump)
        self._pump_scheduled = False
        self._pumping = False
        self._inflight = Inflight(stats)
        self._stopped = False

    @abc.abstractmethod
    def _pump(self) -> None:
        """Step the decision: start what may start now, and arm the alarm for the next deadline."""

    def inflight(self) -> int:
        return self._inflight.count

    def queue_depth(self) -> int:
        return len(self._queue)

    def problem(self) -> str | None:
        return workers_problem(self.workers)

    def _schedule_pump(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            loop.call_soon(self._pump)

    async def stop(self) -> None:
        self._stopped = True
        await self._inflight.drained()
        self._alarm.cancel()
        await close_workers(self.workers)


class Inflight:
    """The requests a scheduler accepted and has not answered, and a way to
    wait until there are none (``stop`` drains before releasing instances).

    ``pending`` counts in the model's ``ModelStats.pending`` too (the queue
    depth metric); a split request's parent is in flight but not pending.
    """

    __slots__ = ("count", "_stats", "_idle")

    def __init__(self, stats: "ModelStats") -> None:
        self.count = 0
        self._stats = stats
        self._idle: asyncio.Event | None = None

    def enter(self, pending: bool = True) -> None:
        self.count += 1
        if pending:
            self._stats.pending += 1

    def leave(self, pending: bool = True) -> None:
        self.count -= 1
        if pending:
            self._stats.pending -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def drained(self) -> None:
        if self.count:
            self._idle = asyncio.Event()
            await self._idle.wait()
