"""Instance workers: where a batch actually executes.

Executions are timed in CPU time of the calling thread
(``time.thread_time_ns``), not wall time: on a busy machine a preempted run
or a wait for the GIL would otherwise read as a slow model.

The hand-off between the event loop and a runtime is the expensive part of a
Python server's request path: waking a thread and getting the result back
costs hundreds of microseconds under GIL contention, which dwarfs a small
model's compute. So each instance decides where it runs:

- ``thread``: a dedicated worker thread per instance; the loop is never
  blocked, whatever the model does.
- ``inline``: on the event loop itself, for models whose executions take
  a few tens of microseconds.
- ``auto`` (default): time a few executions of a one-row sample at load
  (:meth:`InstanceWorker.calibrate`, where no other thread competes for the
  GIL) and start inline if they stay well under ``inline_max_microseconds``;
  otherwise start on the thread, and move a model whose executions average
  well under the limit onto the loop;
  move it back when the running mean passes the limit, or at once when one
  execution takes ten times the limit. After three such flips the model stays
  on its thread, so a model with erratic timing cannot keep stalling the loop.

A model with ``inferd.execution_timeout_microseconds`` always runs on its
thread, and an execution that passes the limit fails its batch with
DEADLINE_EXCEEDED at once. A thread cannot be killed, so the worker *retires*
it: the thread is left to finish the stuck call on its own (then it closes its
instance and ends), and a new instance is built off the loop (``rebuild``: the
backend loads the model again and warms it up) to take the next batches, which
wait for it. Each retired thread keeps its instance's memory (the model's
weights, its runtime) until its call returns, and one stuck in Python code
also takes its share of the GIL; so at most ``max_retired`` of them may be
outstanding per instance: past that no new instance is built and the worker
answers UNAVAILABLE (the model is reported not ready) until one returns.

- ``remote``: the instance runs elsewhere (a model host process, :mod:`inferd.hosts`): a batch is
  handed to it on the loop (``instance.submit``) and its outcome comes back on the loop, with no
  thread of the worker's waiting; an execution timeout is the instance's own (it stops its host).
  A model with several instances hands each one batch at a time: a batch handed to a busy host would
  wait there while another instance may free up first (and a model whose requests wait for each other
  would deadlock). A model's only instance may take a *train* (:attr:`InstanceWorker.trains`): the
  ready batches of its queue, up to a bound, handed over together and sent in one write
  (:meth:`InstanceWorker.hold`); the host runs them one after another and answers them as they end
  (those that end within 200 us of each other in one message).

A :class:`~inferd.backends.base.TensorInstance` on its thread may be handed its
next batch while it still executes one (:attr:`InstanceWorker.can_stage`, the
scheduler decides when): the batch is assembled on the loop into the instance's
pooled buffers and executes as soon as the thread is free. Not with an
execution timeout (each batch's timer runs from when it is handed over, and a
retired thread would strand the batch behind it) nor under the rate limiter
(it grants an instance one execution at a time).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from queue import SimpleQueue
from typing import Callable, Sequence

import numpy as np

from inferd.backends.base import Assembled, BatchResult, ModelInstance
from inferd.clock import Clock, MonotonicClock, TimerHandle
from inferd.errors import DeadlineExceeded, Unavailable
from inferd.scheduling.estimates import ExecutionModel
from inferd.scheduling.rate_limiter import Ticket

log = logging.getLogger(__name__)

Done = Callable[["InstanceWorker", BatchResult | BaseException], None]

PROBE_EXECUTIONS = 8  # thread executions measured before trying the loop
MAX_FLIPS = 3
SLOW_FACTOR = 10  # one inline run this many times the limit moves the model off the loop


class _Job:
    __slots__ = ("batch", "outputs", "done", "loop", "timer", "over")

    def __init__(self, batch: Sequence[dict[str, np.ndarray]] | Assembled | BaseException, outputs: Sequence[str],
                 done: Done, loop: asyncio.AbstractEventLoop) -> None:
        self.batch = batch  # the requests' inputs, or assembled ahead (or what assembling raised)
        self.outputs = outputs
        self.done = done
        self.loop = loop
        self.timer: TimerHandle | None = None
        self.over = False  # ran past the execution timeout: answered already


class _Thread:
    """A worker thread and the instance it executes on; ``retired`` once an execution overran."""

    __slots__ = ("instance", "jobs", "thread", "retired")

    def __init__(self, instance: ModelInstance) -> None:
        self.instance = instance
        self.jobs: SimpleQueue = SimpleQueue()
        self.thread: threading.Thread | None = None
        self.retired = False


class InstanceWorker:
    def __init__(self, instance: ModelInstance, mode: str = "auto", inline_max_us: int = 1000,
                 ticket: Ticket | None = None, *, timeout_us: int = 0,
                 rebuild: Callable[[], ModelInstance] | None = None, max_retired: int = 2,
                 clock: Clock | None = None) -> None:
        """``ticket``: the instance's place in the server's rate limiter (None: not limited); each
        execution waits for its resources and gives them back when it ends. ``timeout_us``: the
        execution timeout (0: none; it needs ``mode`` thread); ``rebuild``: creates a fresh instance
        when one is retired (None: it is not replaced)."""
        self.instance = instance
        self.ticket = ticket
        self.name = instance.name
        self.mode = mode
        self.inline = mode == "inline"
        self._inline_max_ns = inline_max_us * 1000
        self._fast_runs = 0
        self._flips = 0
        self.mean_ns: int | None = None
        self._thread: _Thread | None = None
        self.jobs = 0  # batches handed over and not answered: one executing, maybe one assembled behind it
        self.estimate = ExecutionModel()  # seconds per execution by rows, learned as they end
        self.free_at = 0.0  # when the batches handed over are expected to end (kept by the driver)
        self.ended_at = 0.0  # when the driver saw its last batch end
        self.stage_from = 0.0  # when it may take its next batch while still executing (kept by the driver)
        if getattr(instance, "remote", False):
            self.mode = "remote"
            timeout_us = 0  # the instance times its executions itself (it stops its host)
        elif timeout_us and mode != "thread":
            raise ValueError(f"instance {self.name}: an execution timeout needs mode 'thread', got '{mode}'")
        self._timeout_s = timeout_us / 1e6
        self._rebuild = rebuild
        self._max_retired = max_retired
        self._clock = clock or MonotonicClock()
        self.retired = 0  # retired threads whose stuck execution has not returned yet
        self.failed: str | None = None  # why no instance can execute now (retired too many, rebuild failed)
        self._rebuilding = False
        self._waiting: _Job | None = None  # the batch that waits for the new instance
        self._owned = True  # ``instance`` is ours to close (not a retired thread's)
        self._closed = False

    @property
    def busy(self) -> bool:
        return self.jobs > 0

    @property
    def can_stage(self) -> bool:
        """Executing one batch on its thread, with room for the next, assembled meanwhile
        (not with an execution timeout or a rate limiter ticket: the module's docstring)."""
        return (self.jobs == 1 and not self.inline and self.ticket is None and not self._timeout_s
                and not self._rebuilding and getattr(self.instance, "assembles_ahead", False))

    @property
    def trains(self) -> bool:
        """Whether it may be handed several batches at once, sent together (a remote instance that
        allows it, not under the rate limiter, which grants one execution at a time)."""
        return self.mode == "remote" and self.ticket is None and getattr(self.instance, "trains", False)

    def hold(self) -> None:
        """The batches :meth:`run` is handed until :meth:`release` reach the instance together."""
        self.instance.hold()  # type: ignore[attr-defined]

    def release(self) -> None:
        self.instance.release()  # type: ignore[attr-defined]

    def calibrate(self, sample: dict[str, np.ndarray], outputs: Sequence[str], runs: int = 3) -> int | None:
        """Time ``runs`` executions of ``sample`` at load; blocking. Returns the
        fastest in ns (None if the sample fails) and, in auto mode, starts the
        instance inline when that is well under the limit."""
        best: int | None = None
        for _ in range(runs):
            t0 = time.thread_time_ns()
            try:
                self.instance.execute([sample], outputs)
            except Exception:
                return None
            elapsed = time.thread_time_ns() - t0
            best = elapsed if best is None else min(best, elapsed)
        if self.mode == "auto" and best is not None and best <= self._inline_max_ns // 2:
            self.inline = True
            self.mean_ns = best
        return best

    def run(
        self,
        inputs: Sequence[dict[str, np.ndarray]],
        outputs: Sequence[str],
        done: Done,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Execute a batch; ``done(worker, result)`` is called on the loop.

        Inline (or refused: the worker has failed), ``done`` runs before this returns; on a thread, later;
        with a rate limiter ticket, once the resources are allocated. A second batch may be handed over
        while one executes on the thread (:attr:`can_stage`): it is assembled now, and executes as soon
        as the first ends.
        """
        self.jobs += 1
        if self.ticket is not None:
            self.ticket.request(lambda: self._start(inputs, outputs, done, loop))
            return
        self._start(inputs, outputs, done, loop)

    def _start(self, inputs: Sequence[dict[str, np.ndarray]], outputs: Sequence[str], done: Done,
               loop: asyncio.AbstractEventLoop) -> None:
        if self.inline:
            result = self.run_inline(inputs, outputs)
            self._ended()
            done(self, result)
            return
        if self.mode == "remote":
            self.instance.submit(inputs, outputs, lambda result: self._remote_done(done, result))  # type: ignore[attr-defined]
            return
        if self.failed is not None:
            self._ended()
            done(self, Unavailable(self.failed))
            return
        if self._rebuilding:
            self._waiting = _Job(inputs, outputs, done, loop)  # no staging while rebuilding: one batch waits
            return
        # Assembled here, on the loop: the thread may be executing the batch before.
        self._submit(_Job(self._assemble(inputs), outputs, done, loop))

    def _remote_done(self, done: Done, result: BatchResult | BaseException) -> None:
        self._ended()
        done(self, result)

    def _assemble(self, inputs: Sequence[dict[str, np.ndarray]]) -> Sequence[dict[str, np.ndarray]] | Assembled | BaseException:
        if not getattr(self.instance, "assembles_ahead", False):
            return inputs
        try:
            return self.instance.assemble(inputs)  # type: ignore[attr-defined]  # TensorInstance: into pooled buffers
        except BaseException as exc:  # the batch's result: every path resolves it
            return exc

    def _ended(self) -> None:
        self.jobs -= 1
        if self.ticket is not None:
            self.ticket.release()

    def _submit(self, job: _Job) -> None:
        t = self._thread
        if t is None:
            t = self._thread = _Thread(self.instance)
            t.thread = threading.Thread(target=self._serve, args=(t,), name=f"inferd-{self.name}", daemon=True)
            t.thread.start()
        if self._timeout_s:
            job.timer = self._clock.call_at(self._clock.now() + self._timeout_s, lambda: self._overran(job))
        t.jobs.put(job)

    def run_inline(self, inputs: Sequence[dict[str, np.ndarray]], outputs: Sequence[str]) -> BatchResult | BaseException:
        """Execute a batch here, on the calling (loop) thread; never raises."""
        t0 = time.thread_time_ns()
        try:
            result: BatchResult | BaseException = self.instance.execute(inputs, outputs)
        except BaseException as exc:  # every path resolves the batch
            result = exc
        self._observe(time.thread_time_ns() - t0)
        return result

    def _serve(self, t: _Thread) -> None:
        jobs = t.jobs
        while True:
            job = jobs.get()
            if job is None:
                break
            t0 = time.thread_time_ns()
            batch = job.batch
            try:
                if isinstance(batch, BaseException):
                    raise batch
                result: BatchResult | BaseException = (
                    t.instance.execute_assembled(batch, job.outputs) if isinstance(batch, Assembled)  # type: ignore[attr-defined]
                    else t.instance.execute(batch, job.outputs))
            except BaseException as exc:
                result = exc
            elapsed = time.thread_time_ns() - t0
            try:
                job.loop.call_soon_threadsafe(self._finish, job, result, elapsed)
            except RuntimeError:  # the loop closed under us: nobody is waiting
                break
            if t.retired:
                break
        if t.retired:  # its stuck execution returned at last: nobody else will use the instance
            _close_quietly(t.instance)

    def _finish(self, job: _Job, result: BatchResult | BaseException, elapsed_ns: int) -> None:
        if job.over:  # answered at its timeout; a retired thread got free
            self.retired -= 1
            log.info("instance %s: a retired execution returned after the timeout; %d still stuck",
                     self.name, self.retired)
            if self.failed is not None and self._rebuild is not None and self.retired <= self._max_retired:
                self.failed = None
                self._start_rebuild(job.loop)
            return
        if job.timer is not None:
            job.timer.cancel()
        self._observe(elapsed_ns)
        self._ended()
        job.done(self, result)

    def _overran(self, job: _Job) -> None:
        """The execution timeout passed: fail the batch, retire the thread, replace the instance."""
        job.over = True
        t = self._thread
        assert t is not None
        t.retired = True
        t.jobs.put(None)  # the thread ends once the stuck call returns, and closes its instance
        self._thread = None
        self._owned = False
        self.retired += 1
        model = getattr(getattr(t.instance, "model", None), "name", self.name)
        limit_us = round(self._timeout_s * 1e6)
        error = DeadlineExceeded(
            f"model '{model}': the execution on instance {self.name} ran past inferd.execution_timeout_microseconds "
            f"({limit_us} us); the instance was retired and a new one takes the next requests")
        log.error("%s (%d retired executions still running)", error.message, self.retired)
        if self._rebuild is None or self.retired > self._max_retired:
            self.failed = (f"model '{model}': instance {self.name} is unavailable: {self.retired} executions are "
                           f"stuck past inferd.execution_timeout_microseconds ({limit_us} us), more than "
                           f"inferd.max_retired_instances ({self._max_retired}); it serves again when one returns")
        else:
            self._start_rebuild(job.loop)
        self._ended()
        job.done(self, error)

    def _start_rebuild(self, loop: asyncio.AbstractEventLoop) -> None:
        self._rebuilding = True
        assert self._rebuild is not None
        loop.run_in_executor(None, self._rebuild).add_done_callback(self._rebuilt)

    def _rebuilt(self, future: asyncio.Future) -> None:
        self._rebuilding = False
        exc = future.exception()
        if exc is not None:
            self.failed = f"instance {self.name} is unavailable: building a new instance failed: {exc}"
            log.error("%s", self.failed)
        elif self._closed:
            _close_quietly(future.result())
            return
        else:
            self.instance, self._owned = future.result(), True
            log.info("instance %s: a new instance replaced the retired one", self.name)
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            return
        if self.failed is not None:
            self._ended()
            waiting.done(self, Unavailable(self.failed))
        else:
            self._submit(waiting)

    def _observe(self, elapsed_ns: int) -> None:
        if self.mode != "auto":
            return
        # An exponentially weighted mean rides out the odd preempted run on a
        # busy machine; one run far past the limit still moves at once.
        ewma = self.mean_ns = elapsed_ns if self.mean_ns is None else (self.mean_ns * 7 + elapsed_ns) >> 3
        limit = self._inline_max_ns
        if self.inline:
            if ewma > limit or elapsed_ns > SLOW_FACTOR * limit:
                self.inline = False
                self._fast_runs = 0
                self._flips += 1
                log.info("instance %s: executions take %d us (last %d us); moving it off the event loop",
                         self.name, ewma // 1000, elapsed_ns // 1000)
            return
        if self._flips >= MAX_FLIPS:
            return
        if elapsed_ns <= limit:
            self._fast_runs += 1
            if self._fast_runs >= PROBE_EXECUTIONS and ewma <= limit // 2:
                self.inline = True
                log.info("instance %s: executions take %d us; running it on the event loop",
                         self.name, ewma // 1000)
        else:
            self._fast_runs = 0

    def close(self) -> None:
        """Stop the thread (after the jobs already queued) and free the runtime. Retired threads are
        not waited for: each closes its own instance if its stuck call ever returns."""
        self._closed = True
        t = self._thread
        if t is not None:
            t.jobs.put(None)
            if t.thread is not None:
                t.thread.join(timeout=30)
        if self.ticket is not None:
            self.ticket.close()
        if self._owned:
            self.instance.close()


def _close_quietly(instance: ModelInstance) -> None:
    try:
        instance.close()
    except Exception:
        log.exception("closing a retired instance of %s failed", instance.name)


async def close_workers(workers: Sequence["InstanceWorker"]) -> None:
    """Stop every worker's thread and free its runtime, off the event loop (a scheduler's stop)."""
    def close() -> None:
        for worker in workers:
            worker.close()

    await asyncio.get_running_loop().run_in_executor(None, close)
