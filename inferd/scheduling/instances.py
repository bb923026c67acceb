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
from inferd.scheduling.estimates import ExecutionModel
from inferd.scheduling.rate_limiter import Ticket

log = logging.getLogger(__name__)

Done = Callable[["InstanceWorker", BatchResult | BaseException], None]

PROBE_EXECUTIONS = 8  # thread executions measured before trying the loop
MAX_FLIPS = 3
SLOW_FACTOR = 10  # one inline run this many times the limit moves the model off the loop


class InstanceWorker:
    """``ticket``: the instance's place in the server's rate limiter (None: not limited);
    each execution waits for its resources, and gives them back when it ends."""

    def __init__(self, instance: ModelInstance, mode: str = "auto", inline_max_us: int = 1000,
                 ticket: Ticket | None = None) -> None:
        self.instance = instance
        self.ticket = ticket
        self.name = instance.name
        self.mode = mode
        self.inline = mode == "inline"
        self._inline_max_ns = inline_max_us * 1000
        self._fast_runs = 0
        self._flips = 0
        self.mean_ns: int | None = None
        self._jobs: SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self.jobs = 0  # batches handed over and not done: one executing, maybe one assembled behind it
        self.estimate = ExecutionModel()  # seconds per execution by rows, learned as they end
        self.free_at = 0.0  # when the batches handed over are expected to end (kept by the driver)
        self.ended_at = 0.0  # when the driver saw its last batch end
        self.stage_from = 0.0  # when it may take its next batch while still executing (kept by the driver)

    @property
    def busy(self) -> bool:
        return self.jobs > 0

    @property
    def can_stage(self) -> bool:
        """Executing one batch on its thread, with room for the next, assembled meanwhile.
        Not under the rate limiter: it grants an instance one execution at a time (a batch
        handed over behind another would ask for its resources a second time)."""
        return (self.jobs == 1 and not self.inline and self.ticket is None
                and getattr(self.instance, "assembles_ahead", False))

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

        Inline, ``done`` runs before this returns; on a thread, later; with a rate
        limiter ticket, once the resources are allocated. A second batch may be handed
        over while one executes on the thread (:attr:`can_stage`): it is assembled now,
        and executes as soon as the first ends.
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
        job = self._assemble(inputs)  # here, on the loop: the thread may be executing the batch before
        if self._thread is None:
            self._start_thread()
        assert self._jobs is not None
        self._jobs.put((job, outputs, done, loop))

    def _assemble(self, inputs: Sequence[dict[str, np.ndarray]]) -> object:
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

    def run_inline(self, inputs: Sequence[dict[str, np.ndarray]], outputs: Sequence[str]) -> BatchResult | BaseException:
        """Execute a batch here, on the calling (loop) thread; never raises."""
        t0 = time.thread_time_ns()
        try:
            result: BatchResult | BaseException = self.instance.execute(inputs, outputs)
        except BaseException as exc:  # every path resolves the batch
            result = exc
        self._observe(time.thread_time_ns() - t0)
        return result

    def _start_thread(self) -> None:
        self._jobs = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"inferd-{self.name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        jobs = self._jobs
        assert jobs is not None
        while True:
            job = jobs.get()
            if job is None:
                return
            batch, outputs, done, loop = job
            t0 = time.thread_time_ns()
            try:
                if isinstance(batch, BaseException):
                    raise batch
                result: BatchResult | BaseException = (
                    self.instance.execute_assembled(batch, outputs) if isinstance(batch, Assembled)  # type: ignore[attr-defined]
                    else self.instance.execute(batch, outputs))  # type: ignore[arg-type]
            except BaseException as exc:
                result = exc
            elapsed = time.thread_time_ns() - t0
            try:
                loop.call_soon_threadsafe(self._finish, done, result, elapsed)
            except RuntimeError:  # the loop closed under us: nobody is waiting
                return

    def _finish(self, done: Done, result: BatchResult | BaseException, elapsed_ns: int) -> None:
        self._observe(elapsed_ns)
        self._ended()
        done(self, result)

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
        """Stop the thread (after the jobs already queued) and free the runtime."""
        if self._jobs is not None:
            self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.ticket is not None:
            self.ticket.close()
        self.instance.close()


async def close_workers(workers: Sequence["InstanceWorker"]) -> None:
    """Stop every worker's thread and free its runtime, off the event loop (a scheduler's stop)."""
    def close() -> None:
        for worker in workers:
            worker.close()

    await asyncio.get_running_loop().run_in_executor(None, close)
