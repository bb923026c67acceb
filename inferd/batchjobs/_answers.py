"""An OpenAI batch's lines and answers: its input file checked and read, its answers written.

A line is ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body"}``
(:func:`check_input` names every bad line with OpenAI's error codes, before a
batch is accepted). An answer is a line of the batch's output file (a 200) or
of its error file (a refusal: its status and OpenAI's error body)::

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}

:class:`AnswerFiles` appends them, and reads them back when a batch resumes: a
custom id with an answer in either file is not run again. A last line cut short
by a crash is cut off, and its request runs again.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

from inferd.batchjobs._lines import Line
from inferd.facade import OPENAI_BATCH_ENDPOINTS

MAX_LINES = 50_000  # OpenAI's limit of requests per batch
MAX_ERRORS_SHOWN = 100  # a failed validation lists at most this many bad lines


def new_id(prefix: str) -> str:
    """An OpenAI object id: ``file-<hex>``, ``batch_<hex>``, ``batch_req_<hex>``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}" if prefix == "file" else f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class Answer:
    """One line's answer: as its endpoint answers a request (status 200 and the body), or its refusal."""

    custom_id: str
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.status == 200


def check_input(path: Path, endpoint: str) -> tuple[list[dict[str, Any]], int]:
    """The input file's bad lines (OpenAI's batch errors, at most MAX_ERRORS_SHOWN) and its count of
    requests; read line by line (a file may hold 200 MB)."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    total = 0

    def bad(number: int, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        if len(errors) < MAX_ERRORS_SHOWN:
            errors.append({"code": code, "message": f"line {number}: {message}", "param": param, "line": number})

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
                    "mismatched_endpoint" if line.get("url") in OPENAI_BATCH_ENDPOINTS else "invalid_url")
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


def read_input(path: Path) -> Iterator[Line]:
    """A checked input file's lines, one at a time (the body is the line's ``body``)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                line = json.loads(raw)
                yield Line(number, line["custom_id"], line["body"])


def answer_line(answer: Answer) -> bytes:
    doc = {"id": new_id("batch_req"), "custom_id": answer.custom_id,
           "response": {"status_code": answer.status, "request_id": answer.body.get("id") or uuid.uuid4().hex,
                        "body": answer.body},
           "error": None}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


class AnswerFiles:
    """A batch's output file (its 200s) and error file (its refusals), appended as answers come."""

    def __init__(self, output: Path, error: Path) -> None:
        self._files: list[IO[bytes]] = []
        self._ids: list[set[str]] = []
        for path in (output, error):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._ids.append(_answered(path))
            self._files.append(open(path, "ab"))

    def done(self) -> set[str]:
        return self._ids[0] | self._ids[1]

    def counts(self) -> tuple[int, int]:
        return len(self._ids[0]), len(self._ids[1])

    def write(self, answer: Answer) -> None:
        which = 0 if answer.ok else 1
        if answer.custom_id in self._ids[0] or answer.custom_id in self._ids[1]:
            return  # one answer per custom id
        self._files[which].write(answer_line(answer))
        self._ids[which].add(answer.custom_id)

    def sync(self) -> None:
        for f in self._files:
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self._files:
            if not f.closed:
                f.flush()
                os.fsync(f.fileno())
                f.close()


def _answered(path: Path) -> set[str]:
    """The custom ids answered in a file; a last line cut short by a crash is cut off."""
    ids: set[str] = set()
    if not path.exists():
        return ids
    with open(path, "rb") as f:
        data = f.read()
    keep = 0
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break
        try:
            ids.add(json.loads(raw)["custom_id"])
        except (ValueError, KeyError, TypeError):
            break
        keep += len(raw)
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
    return ids
