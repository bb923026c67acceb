"""Batch jobs kept on disk: submitted, run, resumed after a restart, cancelled.

Each job is a folder under the batch directory::

    <batch dir>/<job id>/job.json       what it is and where it stands (written whole, renamed into place)
                         input.jsonl    the submitted requests, as received
                         results.jsonl  one result per custom id, appended as they come

A job is ``queued`` until its runner starts, then ``running``, and ends
``completed`` (every line has a result: an output or an error), ``cancelled``
or ``failed`` (its input could not be read back). A server that stops leaves
its running jobs ``running`` on disk, and the next one with the same batch
directory resumes them where they stopped: the lines with a result are not
run again, so each custom id gets exactly one result.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import numpy as np

from inferd.batchjobs._lines import Line, parse_lines
from inferd.batchjobs._results import JsonlResults, Result, read_jsonl
from inferd.batchjobs._runner import Progress, run_lines
from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, NotFound
from inferd.observability.stats import wall_ms

log = logging.getLogger(__name__)

QUEUED, RUNNING, COMPLETED, CANCELLING, CANCELLED, FAILED = (
    "queued", "running", "completed", "cancelling", "cancelled", "failed")
_UNFINISHED = (QUEUED, RUNNING, CANCELLING)
JOB_FILE, INPUT_FILE, RESULTS_FILE = "job.json", "input.jsonl", "results.jsonl"

# infer(model, version, line) -> (model version, outputs); the server's data plane behind it.
JobInfer = Callable[[str, int, Line], Awaitable[tuple[str, dict[str, np.ndarray]]]]


@dataclass(slots=True)
class JobInfo:
    id: str
    model: str
    model_version: int  # 0: as the model's version policy chooses
    status: str = QUEUED
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    created_at_ms: int = 0
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    error: str | None = None  # why a job failed
    extra: dict[str, Any] = field(default_factory=dict)  # filled in by the server (scheduling accounting)

    @property
    def completed(self) -> int:
        return self.succeeded + self.failed

    def document(self) -> dict[str, Any]:
        """The job as ``GET /v2/batches/{id}`` shows it."""
        doc = {
            "id": self.id, "model": self.model, "model_version": str(self.model_version or ""),
            "status": self.status,
            "request_counts": {"total": self.total, "completed": self.completed,
                               "succeeded": self.succeeded, "failed": self.failed},
            "created_at_ms": self.created_at_ms, "started_at_ms": self.started_at_ms,
            "finished_at_ms": self.finished_at_ms,
        }
        if self.error:
            doc["error"] = self.error
        doc.update(self.extra)
        return doc


class BatchJobs:
    """The jobs of one batch directory, and their runners (one task per job)."""

    def __init__(self, root: Path, infer: JobInfer, clock: Clock | None = None, window: int = 64) -> None:
        self.root = root
        self._infer = infer
        self._clock = clock or MonotonicClock()
        self._window = window
        self._jobs: dict[str, JobInfo] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping = False

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Read the jobs already in the batch directory; resume the unfinished ones."""
        if not self.root.is_dir():
            return  # created at the first submit
        for folder in sorted(self.root.iterdir()):
            info = _read_info(folder)
            if info is None:
                continue
            self._jobs[info.id] = info
            if info.status == CANCELLING:
                self._finish(info, CANCELLED)
            elif info.status in _UNFINISHED:
                log.info("batch job %s: resuming (%d of %d done)", info.id, info.completed, info.total)
                self._launch(info)

    async def stop(self) -> None:
        """Stop every runner; unfinished jobs stay as they are on disk, to resume."""
        self._stopping = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the API ----------------------------------------------------------------------

    async def submit(self, data: bytes, model: str, version: int = 0) -> JobInfo:
        """Check ``data`` (JSONL requests) and start a job; InvalidArgument names a bad line."""
        lines = parse_lines(data)
        job_id = f"batch_{uuid.uuid4().hex[:20]}"
        folder = self.root / job_id
        folder.mkdir(parents=True)
        (folder / INPUT_FILE).write_bytes(data)
        info = JobInfo(job_id, model, version, total=len(lines), created_at_ms=wall_ms(self._clock.now()))
        self._jobs[job_id] = info
        _write_info(folder, info)
        self._launch(info, lines)
        return info

    def get(self, job_id: str) -> JobInfo:
        info = self._jobs.get(job_id)
        if info is None:
            raise NotFound(f"batch job '{job_id}' not found")
        return info

    def all(self) -> list[JobInfo]:
        return sorted(self._jobs.values(), key=lambda j: j.created_at_ms)

    async def cancel(self, job_id: str) -> JobInfo:
        """Stop a job; its results so far stay. Cancelling a finished job changes nothing."""
        info = self.get(job_id)
        task = self._tasks.get(job_id)
        if info.status in _UNFINISHED:
            info.status = CANCELLING
            _write_info(self.root / job_id, info)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            self._finish(info, CANCELLED)
        return info

    def results(self, job_id: str) -> Iterator[Result]:
        self.get(job_id)
        return read_jsonl(self.root / job_id / RESULTS_FILE)

    def results_path(self, job_id: str) -> Path:
        self.get(job_id)
        return self.root / job_id / RESULTS_FILE

    async def wait(self, job_id: str) -> JobInfo:
        """Until the job's runner ends (tests and in-process callers)."""
        task = self._tasks.get(job_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        return self.get(job_id)

    # -- running --------------------------------------------------------------------------

    def _launch(self, info: JobInfo, lines: list[Line] | None = None) -> None:
        task = asyncio.ensure_future(self._run(info, lines))
        self._tasks[info.id] = task
        task.add_done_callback(lambda t: self._tasks.pop(info.id, None))

    async def _run(self, info: JobInfo, lines: list[Line] | None) -> None:
        folder = self.root / info.id
        try:
            if lines is None:
                lines = parse_lines((folder / INPUT_FILE).read_bytes(), f"batch job '{info.id}' input")
        except (OSError, InferdError) as exc:
            info.error = f"the job's input could not be read back: {exc}"
            self._finish(info, FAILED)
            return
        writer = JsonlResults(folder / RESULTS_FILE)
        progress = _progress(folder, info.total)
        info.succeeded, info.failed = progress.succeeded, progress.failed
        info.status = RUNNING
        if info.started_at_ms is None:
            info.started_at_ms = wall_ms(self._clock.now())
        _write_info(folder, info)

        def counted(result: Result) -> None:
            info.succeeded, info.failed = progress.succeeded, progress.failed

        async def infer(line: Line) -> tuple[str, dict[str, np.ndarray]]:
            return await self._infer(info.model, info.model_version, line)

        try:
            await run_lines(lines, writer, infer, progress=progress, window=self._window, clock=self._clock,
                            on_result=counted)
        except asyncio.CancelledError:
            if not self._stopping and info.status != CANCELLING:
                raise
            _write_info(folder, info)  # stopping: it resumes from here
            return
        finally:
            writer.close()
            info.succeeded, info.failed = progress.succeeded, progress.failed
        self._finish(info, COMPLETED)

    def _finish(self, info: JobInfo, status: str) -> None:
        info.status = status
        info.finished_at_ms = wall_ms(self._clock.now())
        _write_info(self.root / info.id, info)
        log.info("batch job %s %s: %d succeeded, %d failed of %d", info.id, status, info.succeeded, info.failed,
                 info.total)


def _progress(folder: Path, total: int) -> Progress:
    progress = Progress(total=total)
    for result in read_jsonl(folder / RESULTS_FILE):
        progress.count(result)
    return progress


def _write_info(folder: Path, info: JobInfo) -> None:
    doc = asdict(info)
    doc.pop("extra", None)
    tmp = folder / (JOB_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / JOB_FILE)


def _read_info(folder: Path) -> JobInfo | None:
    path = folder / JOB_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        return JobInfo(**doc)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("batch directory %s: skipping %s, which cannot be read: %s", folder.parent, path, exc)
        return None
