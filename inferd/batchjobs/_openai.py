"""OpenAI's Batch API over the batch-job engine: files of requests, run as batches, files of answers back.

The core owns it (:class:`OpenAIBatches`, in :class:`~inferd.dataplane.batches.BatchService`); the
``/v1/files`` and ``/v1/batches`` routes (:mod:`inferd.frontends.openai`) check the request's fields
and call it through :class:`~inferd.facade.OpenAIBatchAPI`, from any frontend worker. A batch is a
job of the engine (:class:`~inferd.batchjobs._jobs.Jobs`): kept on disk, resumed after a restart,
each custom id answered once, ``IN_FLIGHT`` lines at a time, a line refused UNAVAILABLE tried again
with a growing delay, cancelled at once. Each line runs through :class:`OpenAILines`, injected by
the server's wiring: the ``/v1`` routes' own translation over the core's data plane, every request
it makes a background one (:mod:`inferd.scheduling.background`), its errors in OpenAI's shape.

Where it lives (``<batch dir>/openai``)::

    files/<file id>/content          the bytes (an output or error file's lines appended as they come)
                    file.json        the file object (written whole, renamed into place; an output
                                     file gets its own when its batch ends, if it holds any line)
    batches/<batch id>/job.json      the engine's job; OpenAI's fields in its ``api``
    uploads/<name>                   an upload as the frontend wrote it, until the core takes it

An upload's bytes and a file's content do not travel through calls: the process that receives the
upload writes it to ``uploads/`` and names it (:meth:`OpenAIBatches.create_file`), and a file's
content is read from the path :meth:`OpenAIBatches.content` gives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Protocol

from inferd.batchjobs._answers import Answer, AnswerFiles, check_input, new_id, read_input
from inferd.batchjobs._jobs import CANCELLED, CANCELLING, COMPLETED, FAILED, UNFINISHED, JobInfo, Jobs
from inferd.batchjobs._lines import Line
from inferd.clock import Clock
from inferd.errors import InvalidArgument, NotFound, TooLarge
from inferd.facade import OPENAI_MAX_FILE_BYTES, OPENAI_UPLOADS

WINDOW = "24h"  # the one completion_window OpenAI offers
IN_FLIGHT = 16  # lines of one batch running at once
_STATUS = {"queued": "in_progress", "running": "in_progress", COMPLETED: COMPLETED, CANCELLING: CANCELLING,
           CANCELLED: CANCELLED, FAILED: FAILED}  # the engine's words -> OpenAI's


class OpenAILines(Protocol):
    """How the core runs an OpenAI batch line (:class:`inferd.frontends.openai.BatchLines`)."""

    async def answer(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """The body answered as ``url`` answers a request (never streamed); raises the domain errors
        (Unavailable: the line is tried again later)."""
        ...

    def error(self, exc: BaseException) -> tuple[int, dict[str, Any]]:
        """The status and OpenAI's error body for a line that failed."""
        ...


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _safe(name: str) -> bool:
    """An id names one folder of the store (never a path out of it)."""
    return bool(name) and name.replace("-", "").replace("_", "").isalnum()


class _Bodies:
    """The engine's kind for OpenAI batches: lines read from the input file, answers into the
    output and error files chosen when the batch was made."""

    def __init__(self, store: "OpenAIBatches", lines: OpenAILines) -> None:
        self.store = store
        self._lines = lines

    def lines(self, folder: Path, info: JobInfo) -> Iterable[Line]:
        path = self.store.files / info.api["input_file_id"] / "content"
        if not path.is_file():
            raise OSError(f"its input file '{info.api['input_file_id']}' is gone")
        return read_input(path)

    def writer(self, folder: Path, info: JobInfo) -> AnswerFiles:
        return AnswerFiles(self.store.files / info.api["output_file"] / "content",
                           self.store.files / info.api["error_file"] / "content")

    async def run(self, info: JobInfo, line: Line) -> Answer:
        body = await self._lines.answer(info.api["endpoint"], line.body)
        return Answer(line.custom_id, 200, body)

    def failed(self, line: Line, exc: Exception) -> Answer:
        return Answer(line.custom_id, *self._lines.error(exc))

    def finished(self, folder: Path, info: JobInfo) -> None:
        """The output and error files that hold a line become files (``batch_output``)."""
        for key, shown, name in (("output_file", "output_file_id", "output"), ("error_file", "error_file_id", "error")):
            content = self.store.files / info.api[key] / "content"
            if content.exists() and content.stat().st_size:
                _write_json(content.with_name("file.json"), self.store.file_object(
                    info.api[key], f"{info.id}_{name}.jsonl", "batch_output", content.stat().st_size))
                info.api[shown] = info.api[key]


class OpenAIBatches:
    """The files and batches of one folder (``<batch dir>/openai``), run by the engine."""

    def __init__(self, root: Path, lines: OpenAILines, clock: Clock | None = None, window: int = IN_FLIGHT) -> None:
        self.root = root
        self.files = root / "files"
        self.uploads = root / OPENAI_UPLOADS
        self.jobs: Jobs[Answer] = Jobs(root / "batches", _Bodies(self, lines), clock, window)

    async def start(self) -> None:
        """Resume the batches a previous server left in progress."""
        self.uploads.mkdir(parents=True, exist_ok=True)
        await self.jobs.start()

    async def stop(self) -> None:
        """Stop the runners; their batches stay in progress on disk, to resume at the next start."""
        await self.jobs.stop()

    # -- files ------------------------------------------------------------------------------

    def file_object(self, file_id: str, filename: str, purpose: str, size: int) -> dict[str, Any]:
        return {"id": file_id, "object": "file", "bytes": size, "created_at": self.jobs.now_ms() // 1000,
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}

    def create_file(self, filename: str, purpose: str, upload: str) -> dict[str, Any]:
        """The upload named ``upload`` (written to ``uploads/`` by the frontend that received it) made
        a file; it is moved, not copied. InvalidArgument for a purpose other than ``batch``."""
        if not _safe(upload) or not (self.uploads / upload).is_file():
            raise NotFound(f"file upload: no upload named '{upload}' in {self.uploads}")
        source = self.uploads / upload
        if purpose != "batch":
            source.unlink()
            raise InvalidArgument(f"file upload: 'purpose' must be 'batch' (the only purpose this server keeps "
                                  f"files for), got {purpose!r}")
        size = source.stat().st_size
        if size > OPENAI_MAX_FILE_BYTES:
            source.unlink()
            raise TooLarge(f"file upload: '{filename}' has more than {OPENAI_MAX_FILE_BYTES} bytes, the most a "
                           "batch input file may have")
        file_id = new_id("file")
        folder = self.files / file_id
        folder.mkdir(parents=True)
        source.replace(folder / "content")
        doc = self.file_object(file_id, filename, purpose, size)
        _write_json(folder / "file.json", doc)
        return doc

    def file(self, file_id: str) -> dict[str, Any]:
        doc = _read_json(self.files / file_id / "file.json") if _safe(file_id) else None
        if doc is None:
            raise NotFound(f"No such File object: '{file_id}'")
        return doc

    def list_files(self, purpose: str | None) -> dict[str, Any]:
        docs = [d for d in (_read_json(p / "file.json") for p in self.files.glob("file-*")) if d] \
            if self.files.is_dir() else []
        docs.sort(key=lambda d: (d["created_at"], d["id"]), reverse=True)
        return {"object": "list", "data": [d for d in docs if purpose is None or d["purpose"] == purpose],
                "has_more": False}

    def delete_file(self, file_id: str) -> dict[str, Any]:
        """InvalidArgument while a batch that reads it runs."""
        self.file(file_id)
        for info in self.jobs.all():
            if info.api.get("input_file_id") == file_id and info.status in UNFINISHED:
                raise InvalidArgument(f"file '{file_id}' is the input of batch '{info.id}', which is still "
                                      "running: cancel it first")
        folder = self.files / file_id
        (folder / "file.json").unlink()  # gone for every reader first, then its bytes
        for part in folder.iterdir():
            part.unlink()
        folder.rmdir()
        return {"id": file_id, "object": "file", "deleted": True}

    def content(self, file_id: str) -> Path:
        self.file(file_id)
        return self.files / file_id / "content"

    # -- batches -------------------------------------------------------------------------------

    def create_batch(self, input_file_id: str, endpoint: str, metadata: dict[str, str] | None) -> dict[str, Any]:
        """A batch over an uploaded file (its fields checked by the route); a file that fails the
        check makes a ``failed`` batch naming its bad lines. InvalidArgument: the file is not a batch
        input file."""
        if self.file(input_file_id)["purpose"] != "batch":
            raise InvalidArgument(f"batch request: file '{input_file_id}' is not a batch input file "
                                  "(purpose 'batch')")
        errors, total = check_input(self.files / input_file_id / "content", endpoint)
        now = self.jobs.now_ms()
        info = JobInfo(new_id("batch"), total=0 if errors else total, created_at_ms=now, api={
            "endpoint": endpoint, "input_file_id": input_file_id, "metadata": metadata,
            # Where its answers go, chosen now so that a resumed run appends to the same files.
            "output_file": new_id("file"), "error_file": new_id("file"),
            "errors": {"object": "list", "data": errors} if errors else None})
        if errors:
            info.status, info.finished_at_ms = FAILED, now
        return self.batch_object(self.jobs.add(info))

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self.batch_object(self._job(batch_id))

    def list_batches(self, after: str | None, limit: int) -> dict[str, Any]:
        """Newest first, as OpenAI lists; InvalidArgument: ``after`` names no batch."""
        jobs = sorted(self.jobs.all(), key=lambda j: (j.created_at_ms, j.id), reverse=True)
        if after is not None:
            ids = [j.id for j in jobs]
            if after not in ids:
                raise InvalidArgument(f"batch list: 'after' must be the id of a batch, got {after!r}")
            jobs = jobs[ids.index(after) + 1:]
        page = [self.batch_object(j) for j in jobs[:limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(jobs) > limit}

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """Its lines in flight end, no more start; InvalidArgument for a batch that ended otherwise."""
        info = self._job(batch_id)
        if info.status in (COMPLETED, FAILED):
            raise InvalidArgument(f"Cannot cancel a batch with status '{info.status}' (only a validating or "
                                  "in-progress batch can be cancelled)")
        return self.batch_object(await self.jobs.cancel(batch_id))

    def _job(self, batch_id: str) -> JobInfo:
        try:
            return self.jobs.get(batch_id)
        except NotFound:
            raise NotFound(f"No such Batch object: '{batch_id}'") from None

    @staticmethod
    def batch_object(info: JobInfo) -> dict[str, Any]:
        """The job as OpenAI's Batch object (times in seconds)."""
        api = info.api
        status = _STATUS[info.status]
        created = info.created_at_ms // 1000
        ended = info.finished_at_ms // 1000 if info.finished_at_ms is not None else None
        errors = api.get("errors")
        if errors is None and info.error:  # it failed while running (its input could not be read back)
            errors = {"object": "list", "data": [{"code": "server_error", "param": None, "line": None,
                                                  "message": info.error}]}
        return {
            "id": info.id, "object": "batch", "endpoint": api["endpoint"], "errors": errors,
            "input_file_id": api["input_file_id"], "completion_window": WINDOW, "status": status,
            "output_file_id": api.get("output_file_id"), "error_file_id": api.get("error_file_id"),
            "created_at": created, "in_progress_at": None if api.get("errors") else created,
            "expires_at": created + 24 * 3600, "finalizing_at": ended if status == COMPLETED else None,
            "completed_at": ended if status == COMPLETED else None,
            "failed_at": ended if status == FAILED else None, "expired_at": None,
            "cancelling_at": info.cancel_asked_ms // 1000 if info.cancel_asked_ms is not None else None,
            "cancelled_at": ended if status == CANCELLED else None,
            "request_counts": {"total": info.total, "completed": info.succeeded, "failed": info.failed},
            "metadata": api.get("metadata"),
        }
