"""Batch jobs kept on disk: submitted, run, resumed after a restart, cancelled.

One engine (:class:`Jobs`) for every kind of job; what differs between
kinds is a :class:`JobKind`: how a job's lines read, how one runs, where its
results go. Two kinds use it: :class:`BatchJobs` (``/v2/batches``: KServe
tensors for one model) and OpenAI's Batch API (:mod:`inferd.batchjobs._openai`).

Each job is a folder under the engine's directory::

    <root>/<job id>/job.json       what it is and where it stands (written whole, renamed into place)
                    input.jsonl    the submitted requests, as received (a /v2 job's; an OpenAI
                                   batch reads its input file)
                    results.jsonl  one result per custom id, appended as they come (a /v2 job's; an
                                   OpenAI batch appends to its output and error files)

A job is ``queued`` until its runner starts, then ``running``, and ends
``completed`` (every line has a result: an output or an error), ``cancelled``
or ``failed`` (its input could not be read back, or was refused whole). A server
that stops leaves its running jobs ``running`` on disk, and the next one with the
same directory resumes them where they stopped: the lines with a result are not
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
from typing import Any, Awaitable, Callable, Generic, Iterable, Iterator, Protocol, TypeVar

import numpy as np

from inferd.batchjobs._lines import Line, parse_lines
from inferd.batchjobs._results import JsonlResults, Result, read_jsonl
from inferd.batchjobs._runner import LineResult, Progress, Writer, run_each, tensor_failure
from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, NotFound
from inferd.observability.stats import wall_ms

log = logging.getLogger(__name__)

QUEUED, RUNNING, COMPLETED, CANCELLING, CANCELLED, FAILED = (
    "queued", "running", "completed", "cancelling", "cancelled", "failed")
UNFINISHED = (QUEUED, RUNNING, CANCELLING)
JOB_FILE, INPUT_FILE, RESULTS_FILE = "job.json", "input.jsonl", "results.jsonl"

# infer(model, version, line) -> (model version, outputs); the server's data plane behind it.
JobInfer = Callable[[str, int, Line], Awaitable[tuple[str, dict[str, np.ndarray]]]]


@dataclass(slots=True)
class JobInfo:
    id: str
    model: str = ""  # a /v2 job: the model its lines run on
    model_version: int = 0  # 0: as the model's version policy chooses
    status: str = QUEUED
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    created_at_ms: int = 0
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    error: str | None = None  # why a job failed
    cancel_asked_ms: int | None = None  # when a cancel was asked for
    api: dict[str, Any] = field(default_factory=dict)  # kept with the job for its API (OpenAI's batch fields)
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


R = TypeVar("R", bound=LineResult)


class ResultsWriter(Writer[R], Protocol[R]):
    def counts(self) -> tuple[int, int]:
        """(succeeded, failed) of the results held (a resumed job's counts)."""
        ...


class JobKind(Protocol[R]):
    """What one API's jobs are; the engine calls these on its event loop."""

    def lines(self, folder: Path, info: JobInfo) -> Iterable[Line]:
        """The job's lines, in file order (read again when a job resumes; may be read lazily).
        Raises OSError or InferdError when they cannot be read: the job fails, saying why."""
        ...

    def writer(self, folder: Path, info: JobInfo) -> ResultsWriter[R]:
        """Where the job's results go, opened to append (knowing the ones already there)."""
        ...

    async def run(self, info: JobInfo, line: Line) -> R:
        """One line's result; raises Unavailable to be tried again later, anything else is the
        line's error (:meth:`failed`)."""
        ...

    def failed(self, line: Line, exc: Exception) -> R:
        ...

    def finished(self, folder: Path, info: JobInfo) -> None:
        """The job has ended (``info.status`` says how), before its state is written."""
        ...


class Jobs(Generic[R]):
    """The jobs of one directory and their runners (one task per job), for one kind of job."""

    def __init__(self, root: Path, kind: JobKind[R], clock: Clock | None = None, window: int = 64) -> None:
        self.root = root
        self.kind = kind
        self._clock = clock or MonotonicClock()
        self._window = window
        self._jobs: dict[str, JobInfo] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping = False

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Read the jobs already in the directory; resume the unfinished ones."""
        if not self.root.is_dir():
            return  # created at the first job
        for folder in sorted(self.root.iterdir()):
            info = _read_info(folder)
            if info is None:
                continue
            self._jobs[info.id] = info
            if info.status == CANCELLING:
                self._finish(info, CANCELLED)
            elif info.status in UNFINISHED:
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

    def now_ms(self) -> int:
        """Wall-clock milliseconds now, as the jobs' times are kept."""
        return wall_ms(self._clock.now())

    def add(self, info: JobInfo, data: bytes | None = None, lines: list[Line] | None = None) -> JobInfo:
        """Keep a new job (``data``: its input, kept as the job's own) and start it; a job made
        ``failed`` (its input refused whole) is only kept, for its status to say why."""
        folder = self.root / info.id
        folder.mkdir(parents=True)
        if data is not None:
            (folder / INPUT_FILE).write_bytes(data)
        self._jobs[info.id] = info
        _write_info(folder, info)
        if info.status != FAILED:
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
        if info.status in UNFINISHED:
            info.status = CANCELLING
            info.cancel_asked_ms = info.cancel_asked_ms or self.now_ms()
            _write_info(self.root / job_id, info)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            self._finish(info, CANCELLED)
        return info

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

    async def _run(self, info: JobInfo, lines: Iterable[Line] | None) -> None:
        folder = self.root / info.id
        try:
            if lines is None:
                lines = self.kind.lines(folder, info)
            writer = self.kind.writer(folder, info)
        except (OSError, InferdError) as exc:
            self._fail(info, f"the job's input could not be read back: {exc}")
            return
        progress = Progress(info.total, *writer.counts())
        info.succeeded, info.failed = progress.succeeded, progress.failed
        info.status = RUNNING
        if info.started_at_ms is None:
            info.started_at_ms = self.now_ms()
        _write_info(folder, info)

        def counted(result: R) -> None:
            info.succeeded, info.failed = progress.succeeded, progress.failed

        async def run(line: Line) -> R:
            return await self.kind.run(info, line)

        try:
            await run_each(lines, writer, run, self.kind.failed, progress=progress, window=self._window,
                           clock=self._clock, on_result=counted)
        except asyncio.CancelledError:
            if not self._stopping and info.status != CANCELLING:
                raise
            _write_info(folder, info)  # stopping: it resumes from here
            return
        except (OSError, InferdError, ValueError) as exc:  # its input went unreadable, its disk full
            log.exception("batch job %s failed", info.id)
            self._fail(info, f"the job stopped: {type(exc).__name__}: {exc}")
            return
        finally:
            writer.close()
            info.succeeded, info.failed = progress.succeeded, progress.failed
        self._finish(info, COMPLETED)

    def _fail(self, info: JobInfo, error: str) -> None:
        info.error = error
        self._finish(info, FAILED)

    def _finish(self, info: JobInfo, status: str) -> None:
        info.status = status
        info.finished_at_ms = self.now_ms()
        self.kind.finished(self.root / info.id, info)
        _write_info(self.root / info.id, info)
        log.info("batch job %s %s: %d succeeded, %d failed of %d", info.id, status, info.succeeded, info.failed,
                 info.total)


class _Tensors:
    """The /v2 kind: KServe tensors for one model, the input kept in the job's folder, the results
    in its ``results.jsonl``."""

    def __init__(self, infer: JobInfer) -> None:
        self._infer = infer

    def lines(self, folder: Path, info: JobInfo) -> list[Line]:
        return parse_lines((folder / INPUT_FILE).read_bytes(), f"batch job '{info.id}' input")

    def writer(self, folder: Path, info: JobInfo) -> JsonlResults:
        return JsonlResults(folder / RESULTS_FILE)

    async def run(self, info: JobInfo, line: Line) -> Result:
        version, outputs = await self._infer(info.model, info.model_version, line)
        return Result(line.custom_id, outputs=outputs, model_version=version)

    def failed(self, line: Line, exc: Exception) -> Result:
        return tensor_failure(line, exc)

    def finished(self, folder: Path, info: JobInfo) -> None:
        pass


class BatchJobs(Jobs[Result]):
    """The ``/v2/batches`` jobs of one batch directory: KServe v2 requests for one model each."""

    def __init__(self, root: Path, infer: JobInfer, clock: Clock | None = None, window: int = 64) -> None:
        super().__init__(root, _Tensors(infer), clock, window)

    async def submit(self, data: bytes, model: str, version: int = 0) -> JobInfo:
        """Check ``data`` (JSONL requests) and start a job; InvalidArgument names a bad line."""
        lines = parse_lines(data)
        info = JobInfo(f"batch_{uuid.uuid4().hex[:20]}", model, version, total=len(lines),
                       created_at_ms=self.now_ms())
        return self.add(info, data, lines)

    def results(self, job_id: str) -> Iterator[Result]:
        self.get(job_id)
        return read_jsonl(self.root / job_id / RESULTS_FILE)

    def results_path(self, job_id: str) -> Path:
        self.get(job_id)
        return self.root / job_id / RESULTS_FILE


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
