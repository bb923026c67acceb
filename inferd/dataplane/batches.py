"""The server's batch jobs: the engine (:mod:`inferd.batchjobs`) behind ``/v2/batches`` and OpenAI's Batch API.

``/v2/batches`` (:class:`~inferd.batchjobs.BatchJobs`, in the batch directory): each
line runs as a background request (``request.background``) through the model's own
path (:func:`~inferd.model.run_model`, or :func:`~inferd.model.stream_model` for a
decoupled model, whose responses are joined along the first dimension, one output
tensor per name), so it is validated, scheduled, counted and traced as any request,
and its model's :class:`~inferd.scheduling.background.BackgroundLane` lets it run
only on capacity that interactive requests leave idle. The façade's batch methods
(:class:`~inferd.facade.DataPlaneAPI`) answer with plain documents and bytes.

OpenAI's Batch API (:class:`~inferd.batchjobs.OpenAIBatches`, in ``<batch dir>/openai``): each line
runs through the :class:`~inferd.batchjobs.OpenAILines` the server's wiring hands in (the ``/v1``
translation over this process's data plane, its requests background ones), so a batch is the
core's whichever frontend worker took it, and resumes with the core.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np

from inferd.batchjobs import BatchJobs, JobInfo, Line, OpenAIBatches, OpenAILines, npz_bytes, to_request
from inferd.clock import Clock
from inferd.errors import InvalidArgument, ModelExecutionError
from inferd.model import Model, ModelLookup, run_model, stream_model
from inferd.repository import ModelManager

RESULT_FORMATS = ("jsonl", "npz")


def default_batch_dir(repository: Path) -> Path:
    """Where a server keeps its batch jobs without ``--batch-dir``: next to its first repository."""
    repository = repository.resolve()
    return repository.parent / f"{repository.name}.batches"


class BatchService:
    """The batch jobs of one batch directory (``root``); ``openai``: how OpenAI batch lines run
    (None: OpenAI's Batch API is off)."""

    def __init__(self, manager: ModelManager, root: Path, clock: Clock, openai: OpenAILines | None = None) -> None:
        self.manager = manager
        self.clock = clock
        self.jobs = BatchJobs(root, self._infer, clock)
        self.openai = OpenAIBatches(root / "openai", openai, clock) if openai is not None else None

    async def start(self) -> None:
        """Start-up, once the models are loaded: resume the jobs and batches a previous server left."""
        await self.jobs.start()
        if self.openai is not None:
            await self.openai.start()

    async def stop(self) -> None:
        """A stop has begun: no more lines; unfinished jobs and batches resume at the next start."""
        await self.jobs.stop()
        if self.openai is not None:
            await self.openai.stop()

    async def submit(self, data: bytes, model: str, version: int = 0) -> dict[str, Any]:
        self.manager.get(model, version)  # NotFound / Unavailable for a model that cannot serve now
        return self._document(await self.jobs.submit(data, model, version))

    def status(self, job_id: str) -> dict[str, Any]:
        return self._document(self.jobs.get(job_id))

    def all(self) -> list[dict[str, Any]]:
        return [self._document(info) for info in self.jobs.all()]

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return self._document(await self.jobs.cancel(job_id))

    def results(self, job_id: str, fmt: str = "jsonl") -> bytes:
        if fmt not in RESULT_FORMATS:
            raise InvalidArgument(f"batch results: format must be one of {', '.join(RESULT_FORMATS)}, got '{fmt}'")
        if fmt == "npz":
            return npz_bytes(self.jobs.results(job_id))
        return self.jobs.results_path(job_id).read_bytes() if self.jobs.results_path(job_id).exists() else b""

    def _document(self, info: JobInfo) -> dict[str, Any]:
        doc = info.document()
        try:
            lane = self.manager.get(info.model, info.model_version).scheduler
        except Exception:  # the model is gone: no accounting to show
            return doc
        doc["scheduling"] = {  # how the job's requests shared the model (inferd.scheduling.background)
            "admitted": getattr(lane, "admitted", 0),
            "admitted_over_interactive": getattr(lane, "admitted_over_interactive", 0),
            "interactive_met_batch": getattr(lane, "interactive_met_batch", 0),
        }
        steps = getattr(lane, "background_over_foreground", None)  # an iterative model's parking accounting
        if steps is not None:
            doc["scheduling"]["steps_with_batch_rows_while_interactive_waited"] = steps
        return doc

    async def _infer(self, model: str, version: int, line: Line) -> tuple[str, dict[str, np.ndarray]]:
        return await run_line(self.manager.get, self.clock, model, version, line)


async def run_line(lookup: ModelLookup, clock: Clock, model_name: str, version: int,
                   line: Line) -> tuple[str, dict[str, np.ndarray]]:
    """One line of a job, as a background request on the model ``lookup`` finds: (its version, its outputs)."""
    request = to_request(model_name, version, line)
    model = lookup(model_name, version)
    if not model.decoupled:
        return str(model.version), await run_model(model, request, clock)
    return str(model.version), await _joined(model, request, clock)


async def _joined(model: Model, request: Any, clock: Clock) -> dict[str, np.ndarray]:
    """A decoupled model's responses to one request, each output's tensors joined along axis 0."""
    parts: dict[str, list[np.ndarray]] = {}
    async with aclosing(stream_model(model, request, clock)) as items:
        async for item in items:
            if item.error is not None:
                raise item.error
            if item.response is not None:
                for name, array in item.response.outputs.items():
                    parts.setdefault(name, []).append(array)
    try:
        return {name: np.concatenate(arrays) if len(arrays) > 1 else arrays[0] for name, arrays in parts.items()}
    except ValueError as exc:
        raise ModelExecutionError(f"model '{model.name}': its responses' outputs cannot be joined into one result "
                                  f"per output ({exc})") from None
