"""Batch jobs: a file of inference requests run on idle capacity, a file of results back.

The engine is a library over an injected line runner, so the server's two batch
APIs (``POST /v2/batches`` and OpenAI's ``/v1/batches``, both in the core:
:mod:`inferd.dataplane.batches`) and the laptop command (``inferd batch run``,
in-process) share it:

- :func:`parse_lines`: JSONL input, one KServe v2 inference request per line,
  each with a ``custom_id``;
- :func:`run_lines`: runs the lines without a result yet, writing each result
  as it comes (:class:`JsonlResults`, :class:`ParquetResults`), so a run that
  stops resumes where it stopped and each custom id gets exactly one result;
- :class:`Jobs`: the engine: jobs kept in a directory, resumed after a restart, cancelled, their
  lines run through an injected :class:`JobKind`; :class:`BatchJobs` is ``/v2/batches``' kind
  (KServe tensors for one model), :class:`OpenAIBatches` OpenAI's Batch API (files of OpenAI
  bodies, each line through an injected :class:`OpenAILines`: the ``/v1`` translation).

Batch work reaches a model's scheduler through its background lane
(:mod:`inferd.scheduling.background`): at the lowest priority, and only on
capacity that interactive requests leave idle.
"""

from inferd.batchjobs._jobs import (
    CANCELLED, COMPLETED, FAILED, QUEUED, RUNNING, BatchJobs, JobInfo, JobKind, Jobs,
)
from inferd.batchjobs._answers import Answer
from inferd.batchjobs._lines import CUSTOM_ID, Line, parse_lines, remaining, to_request
from inferd.batchjobs._results import (
    JsonlResults, ParquetResults, Result, ResultWriter, npz_bytes, parquet_available, read_jsonl, result_json,
)
from inferd.batchjobs._openai import OpenAIBatches, OpenAILines
from inferd.batchjobs._runner import Progress, run_each, run_lines

__all__ = [
    "CANCELLED", "COMPLETED", "CUSTOM_ID", "FAILED", "QUEUED", "RUNNING", "Answer", "BatchJobs", "JobInfo", "JobKind",
    "Jobs", "JsonlResults", "Line", "OpenAIBatches", "OpenAILines", "ParquetResults", "Progress", "Result",
    "ResultWriter", "npz_bytes", "parquet_available", "parse_lines", "read_jsonl", "remaining", "result_json",
    "run_each", "run_lines", "to_request",
]
