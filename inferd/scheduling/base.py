"""The one interface every scheduler implements: plain models and ensembles."""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Protocol, Sequence, Sized

import numpy as np

from inferd.clock import Alarm, Clock, MonotonicClock
from inferd.scheduling.instances import close_workers
from inferd.types import InferenceRequest

if TYPE_CHECKING:
    from inferd.observability.stats import ModelStats
    from inferd.scheduling.instances import InstanceWorker


class Completion(Protocol):
    """What :meth:`Scheduler.submit` resolves: an ``asyncio.Future`` is one, and so is the model
    path's :class:`~inferd.model.path.ModelRun`, the one object a request is completed through."""

    def done(self) -> bool: ...

    def set_result(self, result: dict[str, np.ndarray]) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class Scheduler(abc.ABC):
    @abc.abstractmethod
    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """The one way in: run ``request`` (inputs validated, in the model's shapes; ``rows`` is its
        batch size, 1 without batching) and resolve ``completion`` with its outputs or the domain
        error the client should see, once, on the loop (maybe before this returns). ``more``: other
        requests follow in this loop turn (a batcher may hold this one for them). Raises what
        refuses the request before it is queued.

        Returns the cancel, which the caller calls at most once, when it no longer wants the outcome
        (its run ended cancelled, its future was cancelled): the request leaves the scheduler then,
        dropped from the queue if it has not started; one executing runs on, answering nobody. A
        scheduler never resolves a completion that is done, and a cancel that comes after the answer
        (:meth:`infer`'s, a loop turn after its future's) finds nothing to do."""

    async def infer(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        """:meth:`submit` for a caller that awaits the outputs: a future, and the cancel when the
        awaiting task is cancelled."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        cancel = self.submit(request, rows, future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled():  # the awaiting task's cancel reached the future: the request is dropped
                cancel()
            raise

    def interactive(self) -> int:
        """Interactive requests (not a batch job's, ``request.background``) accepted and not answered;
        this default counts every request in flight as one."""
        return self.inflight()

    def when_quiet(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time :meth:`interactive` falls to zero (the batch-job lane's cue).
        This default never calls it: a scheduler that counts its requests (:class:`Inflight`) does."""

    @abc.abstractmethod
    def inflight(self) -> int:
        """Requests accepted and not yet answered."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Finish every accepted request, then release the instances."""

    def problem(self) -> str | None:
        """Why the model cannot execute now (every instance failed), or None."""
        return None

    def merges_rows(self) -> int:
        """The most rows of one request when requests of equal shapes (but for their batch dimension)
        may arrive already concatenated into one, which the model computes as it would the batch it
        forms of them (a dynamic batcher that concatenates: an ensemble groups its steps' requests
        then, inferd/ensemble/grouping.py); 0 where it may not (this default)."""
        return 0


def workers_problem(workers: Sequence["InstanceWorker"]) -> str | None:
    """The first instance's reason when every one of ``workers`` has failed (InstanceWorker.failed)."""
    reasons = [w.failed for w in workers]
    return reasons[0] if reasons and all(reasons) else None


def run_task(work: Coroutine[Any, Any, dict[str, np.ndarray]], completion: Completion) -> Callable[[], None]:
    """:meth:`Scheduler.submit` for a scheduler whose work is a coroutine (an ensemble's steps, a
    whole iterative sequence, a batch-job request waiting in its lane): ``work`` runs in a task
    that resolves ``completion`` as its last step (not in a done callback, a loop turn later); the
    task's cancel is the request's."""
    return asyncio.get_running_loop().create_task(_resolving(work, completion)).cancel


async def _resolving(work: Coroutine[Any, Any, dict[str, np.ndarray]], completion: Completion) -> None:
    try:
        result = await work
    except asyncio.CancelledError:
        raise  # the caller's cancel: it resolves nothing
    except BaseException as exc:
        if not completion.done():
            completion.set_exception(exc)
    else:
        if not completion.done():
            completion.set_result(result)


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

    def interactive(self) -> int:
        return self._inflight.interactive

    def when_quiet(self, callback: Callable[[], None]) -> None:
        self._inflight.quiet = callback

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


class Queued(Protocol):
    """What a scheduler keeps for a request it queued: the request, and the completion to answer
    (None once answered or withdrawn)."""

    request: InferenceRequest
    completion: Completion | None


class Inflight:
    """The requests a scheduler accepted and has not answered, and a way to
    wait until there are none (``stop`` drains before releasing instances).

    ``pending`` counts in the model's ``ModelStats.pending`` too (the queue
    depth metric); a split request's parent is in flight but not pending.
    ``interactive`` counts those that are not a batch job's; :attr:`quiet`,
    when set, is called each time it falls to zero.
    """

    __slots__ = ("count", "interactive", "quiet", "_stats", "_idle")

    def __init__(self, stats: "ModelStats") -> None:
        self.count = 0
        self.interactive = 0
        self.quiet: Callable[[], None] | None = None
        self._stats = stats
        self._idle: asyncio.Event | None = None

    def enter(self, background: bool, pending: bool = True) -> None:
        self.count += 1
        if not background:
            self.interactive += 1
        if pending:
            self._stats.pending += 1

    def leave(self, background: bool, pending: bool = True) -> None:
        self.count -= 1
        if pending:
            self._stats.pending -= 1
        if not background:
            self.interactive -= 1
            if not self.interactive and self.quiet is not None:
                self.quiet()
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    def answer(self, job: Queued, out: dict[str, np.ndarray] | BaseException) -> None:
        """``job``'s request leaves the count and gets ``out``, unless its caller withdrew it (it left
        then) or has gone (a cancelled future: its cancel comes next, and finds nothing)."""
        completion = job.completion
        if completion is None:
            return
        job.completion = None
        self.leave(job.request.background)
        if completion.done():
            return
        if isinstance(out, BaseException):
            completion.set_exception(out)
        else:
            completion.set_result(out)

    def withdraw(self, job: Queued) -> bool:
        """A caller's cancel: ``job``'s request leaves the count now, and nothing answers it; False if
        it had been answered already (an awaiting caller's future is cancelled a loop turn before its
        cancel comes)."""
        if job.completion is None:
            return False
        job.completion = None
        self.leave(job.request.background)
        return True

    async def drained(self) -> None:
        if self.count:
            self._idle = asyncio.Event()
            await self._idle.wait()
