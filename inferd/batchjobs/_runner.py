"""Running a job's lines: through an injected line runner, results written as they come.

:func:`run_each` knows nothing of servers or protocols: ``run(line)``
returns the line's result or raises. An :class:`~inferd.errors.Unavailable`
(the model is loading, unloading, its queue is full, the server drains) is
retried with a growing delay, since a batch job has time; any other error
becomes the line's result through ``failed(line, error)``. Lines whose
custom id already has a result are skipped, so running a job again resumes
it. Both kinds of job run here: KServe tensors (:func:`run_lines`, a line's
outputs) and OpenAI bodies (:mod:`inferd.batchjobs._openai`, a line's answer).

Up to ``window`` lines are in flight at once; the scheduler's background lane
decides how many of them actually run (:mod:`inferd.scheduling.background`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Protocol, TypeVar

import numpy as np

from inferd.batchjobs._lines import Line
from inferd.batchjobs._results import Result, ResultWriter
from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, Unavailable

log = logging.getLogger(__name__)

# infer(line) -> (model version, outputs): a KServe line's run.
Infer = Callable[[Line], Awaitable[tuple[str, dict[str, np.ndarray]]]]
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0
SYNC_EVERY_S = 1.0  # results are made durable (fsync) at least this often


class LineResult(Protocol):
    """What every kind of result has: the line it answers, and whether it is a success."""

    @property
    def custom_id(self) -> str: ...

    @property
    def ok(self) -> bool: ...


R = TypeVar("R", bound=LineResult)


class Writer(Protocol[R]):
    """Where a job's results go: it knows which custom ids it holds (``done``), so each gets one."""

    def done(self) -> set[str]: ...
    def write(self, result: R) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class Progress:
    total: int
    succeeded: int = 0
    failed: int = 0
    retries: int = 0

    @property
    def completed(self) -> int:
        return self.succeeded + self.failed

    def count(self, result: LineResult) -> None:
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


async def run_each(
    lines: Iterable[Line],
    writer: Writer[R],
    run: Callable[[Line], Awaitable[R]],
    failed: Callable[[Line, Exception], R],
    *,
    progress: Progress,
    window: int = 64,
    clock: Clock | None = None,
    on_result: Callable[[R], None] | None = None,
) -> Progress:
    """Run every line without a result yet (``lines`` may be read lazily, in file order); returns the
    counts (including earlier runs'). ``window`` workers take the lines one at a time each."""
    clock = clock or MonotonicClock()
    done = writer.done()
    todo = (line for line in lines if line.custom_id not in done)  # shared: each line is taken by one worker
    loop = asyncio.get_running_loop()
    syncing: list[asyncio.Future] = []
    last_sync = clock.now()

    async def worker() -> None:
        nonlocal last_sync
        for line in todo:
            result = await _attempt(line, run, failed, clock, progress)
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
    """:func:`run_each` for KServe lines: ``infer(line)`` gives its (model version, outputs), an
    error its :class:`Result` with the error's words and kind."""

    async def run(line: Line) -> Result:
        version, outputs = await infer(line)
        return Result(line.custom_id, outputs=outputs, model_version=version)

    return await run_each(lines, writer, run, tensor_failure, progress=progress or Progress(total=len(lines)),
                          window=window, clock=clock, on_result=on_result)


def tensor_failure(line: Line, exc: Exception) -> Result:
    """A KServe line that failed: its result names the error's kind (InternalError: a bug below)."""
    if isinstance(exc, InferdError):
        return Result(line.custom_id, error=exc.message, error_type=type(exc).__name__)
    return Result(line.custom_id, error=f"{type(exc).__name__}: {exc}", error_type="InternalError")


async def _attempt(line: Line, run: Callable[[Line], Awaitable[R]], failed: Callable[[Line, Exception], R],
                   clock: Clock, progress: Progress) -> R:
    delay = RETRY_FIRST_S
    while True:
        try:
            return await run(line)
        except Unavailable as exc:
            progress.retries += 1
            log.info("batch line %d (%s): %s; retrying in %.1f s", line.number, line.custom_id, exc, delay)
            await sleep_until(clock, clock.now() + delay)
            delay = min(delay * 2, RETRY_MAX_S)
        except InferdError as exc:
            return failed(line, exc)
        except Exception as exc:  # a bug below must not stop the job: the line records it
            log.exception("batch line %d (%s) failed", line.number, line.custom_id)
            return failed(line, exc)
