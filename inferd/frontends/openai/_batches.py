"""OpenAI's Batch API on ``/v1``: files of requests, run as a batch, a file of answers back.

``POST /v1/files`` (multipart, ``purpose=batch``) keeps an upload; ``POST /v1/batches`` checks its
lines (``custom_id``, ``method: POST``, ``url`` = the batch's endpoint, ``body``) and runs them;
``GET /v1/batches/{id}`` shows where it stands; the output file (one line per 2xx answer) and the
error file (one per refusal, with the status and OpenAI's error body) are files like the upload,
read with ``GET /v1/files/{id}/content``.

Where it lives: a folder every frontend worker of the server finds (``<batch dir>/openai``, beside
the ``/v2`` batch jobs), so any worker answers for any file or batch::

    files/<file id>/content      the bytes (an output file's lines appended as they come)
                    file.json    the file object (written whole, renamed into place; an output
                                 file gets its own when its batch ends)
    batches/<batch id>/batch.json  the batch object
                       lock        held (flock) by the process running the batch
                       cancel      present once a cancel was asked for

Where each line runs: in the process that holds the batch's lock, through the same ``/v1`` code
as a request (:meth:`OpenAIFrontend.answer`: the model's tokenizer and template are this layer's),
so a line is validated, scheduled and counted as any request. A process that stops leaves the lock
free, and the next ``/v1/files`` or ``/v1/batches`` request any worker serves takes the batch up
where its answers stop: the lines with an answer already written are not run again, so each
custom id gets one answer. A cancel from another worker is seen by the runner between lines.

Hand-written rather than the ``/v2`` engine's (:mod:`inferd.batchjobs`): its lines are KServe
tensors run on one model, these are OpenAI bodies naming their own models, answered as JSON.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any, Iterator

from inferd.errors import InferdError, NotFound, TooLarge, Unavailable
from inferd.frontends.openai._errors import RequestError, error_body

log = logging.getLogger(__name__)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
WINDOW = "24h"  # the one completion_window OpenAI offers
MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's limit for a batch input file (the HTTP body limit may be lower)
MAX_LINES = 50_000  # OpenAI's limit of requests per batch
MAX_ERRORS_SHOWN = 100  # a failed validation lists at most this many bad lines
IN_FLIGHT = 16  # lines of one batch running at once
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0  # a line refused as unavailable (loading, overloaded) waits and runs again
SAVE_EVERY_S = 1.0  # the batch object's counts are written at least this often while it runs
CANCEL_POLL_S = 0.2  # how often a running batch looks for a cancel
RESUME_EVERY_S = 5.0  # how often a process looks for batches no process runs
Answer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
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


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}" if prefix == "file" else f"{prefix}_{uuid.uuid4().hex[:24]}"


def _lock(path: Path) -> IO[bytes] | None:
    """The batch's lock, taken without waiting; None when another process (or task) holds it."""
    f = open(path, "ab")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def _answered(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of an output or error file; a last line cut short by a crash is cut off."""
    if not path.exists():
        return
    keep = 0
    with open(path, "rb") as f:
        data = f.read()
    docs = []
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break
        try:
            docs.append(json.loads(raw))
        except ValueError:
            break
        keep += len(raw)
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
    yield from docs


class BatchStore:
    """Files and batches in one folder; the batches this process runs."""

    def __init__(self, root: Path, answer: Answer, ready: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.root = root
        self._ready = ready  # the server's readiness: a batch is taken up only once its models are loaded
        self.files = root / "files"
        self.batches = root / "batches"
        self._answer = answer
        self._tasks: dict[str, asyncio.Task] = {}
        self._looked = 0.0
        self._stopping = False

    # -- files ------------------------------------------------------------------------------

    async def create_file(self, filename: str, purpose: str, chunks: Any) -> dict[str, Any]:
        """A file from ``chunks`` (an async iterator of bytes), at most MAX_FILE_BYTES."""
        if purpose != "batch":
            raise RequestError(f"file upload: 'purpose' must be 'batch' (the only purpose this server keeps "
                               f"files for), got {purpose!r}", "purpose")
        file_id = _new_id("file")
        folder = self.files / file_id
        folder.mkdir(parents=True)
        size = 0
        try:
            with open(folder / "content", "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > MAX_FILE_BYTES:
                        raise TooLarge(f"file upload: '{filename}' has more than {MAX_FILE_BYTES} bytes, the most "
                                       "a batch input file may have")
                    f.write(chunk)
        except BaseException:
            for part in folder.iterdir():
                part.unlink()
            folder.rmdir()
            raise
        doc = self._file_object(file_id, filename, purpose, size)
        _write_json(folder / "file.json", doc)
        return doc

    @staticmethod
    def _file_object(file_id: str, filename: str, purpose: str, size: int) -> dict[str, Any]:
        return {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}

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
        self.file(file_id)
        for doc in self._all():
            if doc["input_file_id"] == file_id and doc["status"] in ("validating", "in_progress"):
                raise RequestError(f"file '{file_id}' is the input of batch '{doc['id']}', which is still "
                                   "running: cancel it first", "file_id")
        folder = self.files / file_id
        (folder / "file.json").unlink()  # gone for every reader first, then its bytes
        for part in folder.iterdir():
            part.unlink()
        folder.rmdir()
        return {"id": file_id, "object": "file", "deleted": True}

    def _all(self) -> list[dict[str, Any]]:
        return [d for d in (_read_json(p / "batch.json") for p in self.batches.glob("batch_*")) if d] \
            if self.batches.is_dir() else []

    def content(self, file_id: str) -> Path:
        self.file(file_id)
        return self.files / file_id / "content"

    # -- batches -------------------------------------------------------------------------------

    async def create_batch(self, doc: Any) -> dict[str, Any]:
        if not isinstance(doc, dict):
            raise RequestError("batch request: the JSON body must be an object")
        file_id = doc.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise RequestError(f"batch request: 'input_file_id' must be the id of an uploaded file, got "
                               f"{file_id!r}", "input_file_id")
        endpoint = doc.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise RequestError(f"batch request: 'endpoint' must be one of {', '.join(ENDPOINTS)}, got "
                               f"{endpoint!r}", "endpoint")
        if doc.get("completion_window") != WINDOW:
            raise RequestError(f"batch request: 'completion_window' must be '{WINDOW}', got "
                               f"{doc.get('completion_window')!r}", "completion_window")
        metadata = doc.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise RequestError("batch request: 'metadata' must be an object of at most 16 string keys and string "
                               "values", "metadata")
        if self.file(file_id)["purpose"] != "batch":
            raise RequestError(f"batch request: file '{file_id}' is not a batch input file (purpose 'batch')",
                               "input_file_id")
        now = int(time.time())
        batch_id = _new_id("batch")
        batch = {
            "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": file_id,
            "completion_window": WINDOW, "status": "validating", "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "expires_at": now + 24 * 3600, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
            # Where its answers go, chosen now so that a resumed run appends to the same files.
            "_output": _new_id("file"), "_error": _new_id("file"),
        }
        errors, total = self._validate(self.files / file_id / "content", endpoint)
        folder = self.batches / batch_id
        folder.mkdir(parents=True)
        if errors:
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
        else:
            batch.update(status="in_progress", in_progress_at=now)
            batch["request_counts"]["total"] = total
        _write_json(folder / "batch.json", batch)
        if not errors:
            self._start(batch_id)
        return _shown(batch)

    @staticmethod
    def _validate(path: Path, endpoint: str) -> tuple[list[dict[str, Any]], int]:
        """The input file's bad lines (OpenAI's batch errors) and its count of requests."""
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        total = 0

        def bad(number: int, message: str, param: str | None = None, code: str = "invalid_request") -> None:
            if len(errors) < MAX_ERRORS_SHOWN:
                errors.append({"code": code, "message": f"line {number}: {message}", "param": param,
                               "line": number})

        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                except ValueError as exc:
                    bad(number, f"not valid JSON ({exc})", code="invalid_json_line")
                    continue
                if not isinstance(line, dict):
                    bad(number, "must be a JSON object with custom_id, method, url and body")
                    continue
                custom_id = line.get("custom_id")
                if not isinstance(custom_id, str) or not custom_id:
                    bad(number, f"'custom_id' must be a non-empty string, got {custom_id!r}", "custom_id")
                elif custom_id in seen:
                    bad(number, f"custom_id '{custom_id[:64]}' is used by an earlier line; each line needs its own",
                        "custom_id", "duplicate_custom_id")
                else:
                    seen.add(custom_id)
                if line.get("method") != "POST":
                    bad(number, f"'method' must be 'POST', got {line.get('method')!r}", "method")
                if line.get("url") != endpoint:
                    bad(number, f"'url' must be the batch's endpoint '{endpoint}', got {line.get('url')!r}", "url",
                        "mismatched_endpoint" if line.get("url") in ENDPOINTS else "invalid_url")
                if not isinstance(line.get("body"), dict):
                    bad(number, "'body' must be a JSON object (the request's body)", "body")
                total += 1
        if total > MAX_LINES:
            errors.insert(0, {"code": "too_many_requests", "param": None, "line": None,
                              "message": f"the file has {total} requests; a batch may have at most {MAX_LINES}"})
        elif total == 0 and not errors:
            errors.append({"code": "empty_file", "param": None, "line": None,
                           "message": "the file has no requests (one JSON object per line)"})
        return errors, total

    def batch(self, batch_id: str) -> dict[str, Any]:
        return _shown(self._read(batch_id))

    def _read(self, batch_id: str) -> dict[str, Any]:
        doc = _read_json(self.batches / batch_id / "batch.json") if _safe(batch_id) else None
        if doc is None:
            raise NotFound(f"No such Batch object: '{batch_id}'")
        if doc["status"] in ("validating", "in_progress") and (self.batches / batch_id / "cancel").exists():
            doc["status"] = "cancelling"
            doc["cancelling_at"] = _read_json(self.batches / batch_id / "cancel").get("at")  # type: ignore[union-attr]
        return doc

    def list(self, after: str | None, limit: int) -> dict[str, Any]:
        docs = self._all()
        docs.sort(key=lambda d: (d["created_at"], d["id"]), reverse=True)  # newest first, as OpenAI lists
        if after is not None:
            ids = [d["id"] for d in docs]
            if after not in ids:
                raise RequestError(f"batch list: 'after' must be the id of a batch, got {after!r}", "after")
            docs = docs[ids.index(after) + 1:]
        page = [_shown(self._read(d["id"])) for d in docs[:limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(docs) > limit}

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        doc = self._read(batch_id)
        if doc["status"] == "cancelled":
            return _shown(doc)  # cancelling twice changes nothing
        if doc["status"] not in ("validating", "in_progress", "cancelling"):
            raise RequestError(f"Cannot cancel a batch with status '{doc['status']}' (only a validating or "
                               "in-progress batch can be cancelled)", code="batch_not_cancellable")
        folder = self.batches / batch_id
        if not (folder / "cancel").exists():
            _write_json(folder / "cancel", {"at": int(time.time())})
        task = self._tasks.get(batch_id)
        if task is not None:  # running here: its lines in flight end, no new one starts
            await asyncio.gather(task, return_exceptions=True)
        else:
            lock = _lock(folder / "lock")
            if lock is not None:  # nobody runs it: this process ends it
                try:
                    self._finish(self._read_raw(batch_id), "cancelled")
                finally:
                    lock.close()
        return _shown(self._read(batch_id))

    def _read_raw(self, batch_id: str) -> dict[str, Any]:
        doc = _read_json(self.batches / batch_id / "batch.json")
        assert doc is not None
        return doc

    # -- running ----------------------------------------------------------------------------------

    async def resume(self) -> None:
        """Take up the in-progress batches no process runs (their process stopped); at most every
        RESUME_EVERY_S, and only while the server is ready (a server still loading its models would
        answer their lines "model not found")."""
        now = time.monotonic()
        if self._stopping or now - self._looked < RESUME_EVERY_S or not self.batches.is_dir():
            return
        self._looked = now
        if self._ready is not None and not await self._ready():
            return
        for folder in self.batches.glob("batch_*"):
            doc = _read_json(folder / "batch.json")
            if doc and doc["status"] == "in_progress" and folder.name not in self._tasks:
                self._start(folder.name)

    def _start(self, batch_id: str) -> None:
        lock = _lock(self.batches / batch_id / "lock")
        if lock is None:
            return  # another process runs it
        task = asyncio.ensure_future(self._run(batch_id, lock))
        self._tasks[batch_id] = task
        task.add_done_callback(lambda t: self._tasks.pop(batch_id, None))

    async def stop(self) -> None:
        """Stop this process's runners; their batches stay in progress on disk, to resume."""
        self._stopping = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, batch_id: str, lock: IO[bytes]) -> None:
        try:
            batch = self._read_raw(batch_id)
            if batch["status"] != "in_progress":
                return  # ended by another process between its look and its lock
            folder = self.batches / batch_id
            out_dir, err_dir = self.files / batch["_output"], self.files / batch["_error"]
            out_dir.mkdir(parents=True, exist_ok=True)
            err_dir.mkdir(parents=True, exist_ok=True)
            done = {d["custom_id"] for d in _answered(out_dir / "content")}
            failed = {d["custom_id"] for d in _answered(err_dir / "content")}
            counts = batch["request_counts"]
            counts["completed"], counts["failed"] = len(done), len(failed)
            done |= failed
            saved = time.monotonic()
            with open(out_dir / "content", "ab") as out, open(err_dir / "content", "ab") as err:
                slots = asyncio.Semaphore(IN_FLIGHT)
                running: set[asyncio.Task] = set()

                async def one(custom_id: str, body: dict[str, Any]) -> None:
                    nonlocal saved
                    try:
                        status, answer = await self._line(batch["endpoint"], body, folder / "cancel")
                        line = {"id": _new_id("batch_req"), "custom_id": custom_id,
                                "response": {"status_code": status, "request_id": answer.get("id") or
                                             uuid.uuid4().hex, "body": answer}, "error": None}
                        target = out if status == 200 else err
                        target.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
                        target.flush()
                        counts["completed" if status == 200 else "failed"] += 1
                        if time.monotonic() - saved >= SAVE_EVERY_S:
                            saved = time.monotonic()
                            _write_json(folder / "batch.json", batch)
                    finally:
                        slots.release()

                async def watch() -> None:  # a cancel (from any process) ends the lines in flight
                    while not (folder / "cancel").exists():
                        await asyncio.sleep(CANCEL_POLL_S)
                    cancelled.set()
                    for task in list(running):
                        task.cancel()

                cancelled = asyncio.Event()
                watcher = asyncio.ensure_future(watch())
                try:
                    for custom_id, body in _lines(self.files / batch["input_file_id"] / "content"):
                        if custom_id in done:
                            continue
                        await slots.acquire()
                        if cancelled.is_set():
                            slots.release()
                            break
                        task = asyncio.ensure_future(one(custom_id, body))
                        running.add(task)
                        task.add_done_callback(running.discard)
                    await asyncio.gather(*running, return_exceptions=True)
                finally:
                    watcher.cancel()
                    for task in running:
                        task.cancel()
                    await asyncio.gather(watcher, *running, return_exceptions=True)
                    for f in (out, err):
                        f.flush()
                        os.fsync(f.fileno())
                    _write_json(folder / "batch.json", batch)  # stopped: the counts it resumes from
            if self._stopping:
                return  # the server stops: the batch resumes in the next process that serves /v1/batches
            self._finish(batch, "cancelled" if (folder / "cancel").exists() else "completed")
        except asyncio.CancelledError:
            pass  # the server stops: the batch resumes in the next process that serves /v1/batches
        except Exception as exc:  # its input cannot be read back, its folder is gone: the batch fails, saying why
            log.exception("batch %s failed", batch_id)
            try:
                batch = self._read_raw(batch_id)
                batch["errors"] = {"object": "list", "data": [{"code": "server_error", "param": None, "line": None,
                                                              "message": f"{type(exc).__name__}: {exc}"}]}
                self._finish(batch, "failed")
            except Exception:
                log.exception("batch %s: its failure could not be recorded", batch_id)
        finally:
            lock.close()

    async def _line(self, endpoint: str, body: dict[str, Any], cancel: Path) -> tuple[int, dict[str, Any]]:
        delay = RETRY_FIRST_S
        while True:
            try:
                return 200, await self._answer(endpoint, body)
            except Unavailable as exc:  # loading, draining, overloaded: a batch has time
                if cancel.exists():
                    return error_body(exc)
                log.info("batch line: %s; running it again in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
            except InferdError as exc:
                return error_body(exc)
            except Exception as exc:  # a bug below must not stop the batch: the line records it
                return error_body(exc)

    def _finish(self, batch: dict[str, Any], status: str) -> None:
        now = int(time.time())
        if status == "completed":
            batch["finalizing_at"] = now
        batch["status"] = status
        batch[f"{status}_at"] = now
        cancel = _read_json(self.batches / batch["id"] / "cancel")
        if cancel:
            batch["cancelling_at"] = cancel.get("at")
        for key, field, name in (("_output", "output_file_id", "output"), ("_error", "error_file_id", "error")):
            content = self.files / batch[key] / "content"
            if content.exists() and content.stat().st_size:
                _write_json(self.files / batch[key] / "file.json", self._file_object(
                    batch[key], f"{batch['id']}_{name}.jsonl", "batch_output", content.stat().st_size))
                batch[field] = batch[key]
        _write_json(self.batches / batch["id"] / "batch.json", batch)
        log.info("batch %s %s: %s", batch["id"], status, batch["request_counts"])


def _lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                line = json.loads(raw)
                yield line["custom_id"], line["body"]


def _shown(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def _safe(name: str) -> bool:
    """An id names one folder of the store (never a path out of it)."""
    return bool(name) and name.replace("-", "").replace("_", "").isalnum()
