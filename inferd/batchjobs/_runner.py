"""Running a job's lines: through an injected ``infer``, results written as they come.

:func:`run_lines` knows nothing of servers or protocols: ``infer(line)``
returns a line's (model version, output tensors) or raises. An
:class:`~inferd.errors.Unavailable` (the model is loading, unloading, its
queue is full) is retried with a growing delay, since a batch job has time;
any other error is the line's result. Lines whose custom id already has a
result are skipped, so running a job again resumes it.

Up to ``window`` lines are in flight at once; the scheduler's background lane
decides how many of them actually run (:mod:`inferd.scheduling.background`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from inferd.batchjobs._lines import Line, remaining
from inferd.batchjobs._results import Result, ResultWriter
from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, Unavailable

log = logging.getLogger(__name__)

Infer = Callable[[Line], Awaitable[tuple[str, dict[str, np.ndarray]]]]
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0
SYNC_EVERY_S = 1.0  # results are made durable (fsync) at least this often


@dataclass(slots=True)
class Progress:
    total: int
    succeeded: int = 0
    failed: int = 0
    retries: int = 0

    @property
    def completed(self) -> int:
        return self.succeeded + self.failed

    def count(self, result: Result) -> None:
        if result.ok:
            self.succeeded += 1
        else:
            self.failed += 1


async def sleep_until(clock: Clock, when: float) -> None:
    """Wait on ``clock`` (a FakeClock in tests) until ``when``."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    handle = clock.call_at(when, wake)
    try:
        await woken
    finally:
        handle.cancel()


async def run_lines(
    lines: list[Line],
    writer: ResultWriter,
    infer: Infer,
    *,
    progress: Progress | None = None,
    window: int = 64,
    clock: Clock | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> Progress:
    """Run every line without a result yet; returns the counts (including earlier runs').

    ``window`` workers take the lines in file order, one at a time each."""
    clock = clock or MonotonicClock()
    progress = progress or Progress(total=len(lines))
    todo = iter(remaining(lines, writer.done()))  # shared: each line is taken by one worker
    loop = asyncio.get_running_loop()
    syncing: list[asyncio.Future] = []
    last_sync = clock.now()

    async def worker() -> None:
        nonlocal last_sync
        for line in todo:
            result = await _attempt(line, infer, clock, progress)
            writer.write(result)
            progress.count(result)
            if on_result is not None:
                on_result(result)
            if clock.now() - last_sync >= SYNC_EVERY_S and not syncing:
                last_sync = clock.now()  # fsync on a thread; the next waits for this one
                future = loop.run_in_executor(None, writer.sync)
                syncing.append(future)
                future.add_done_callback(lambda f: syncing.remove(f))

    workers = [asyncio.ensure_future(worker()) for _ in range(max(1, window))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, *syncing, return_exceptions=True)
        await loop.run_in_executor(None, writer.sync)
    return progress


async def _attempt(line: Line, infer: Infer, clock: Clock, progress: Progress) -> Result:
    delay = RETRY_FIRST_S
    while True:
        try:
            version, outputs = await infer(line)
        except Unavailable as exc:
            progress.retries += 1
            log.info("batch line %d (%s): %s; retrying in %.1f s", line.number, line.custom_id, exc, delay)
            await sleep_until(clock, clock.now() + delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        except InferdError as exc:
            return Result(line.custom_id, error=exc.message, error_type=type(exc).__name__)
        except Exception as exc:  # a bug below must not stop the job: the line records it
            log.exception("batch line %d (%s) failed", line.number, line.custom_id)
            return Result(line.custom_id, error=f"{type(exc).__name__}: {exc}", error_type="InternalError")
        return Result(line.custom_id, outputs=outputs, model_version=version)
