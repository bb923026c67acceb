"""OpenAIBatches (inferd/batchjobs/_openai.py): OpenAI's Files and Batch API on the batch-job engine, over a
fake line runner: uploads taken from the uploads folder, a line refused UNAVAILABLE tried again after the
engine's delay, a refused line in the error file with its status, a cancel that ends the lines in flight,
the refusals the /v1 routes turn into OpenAI's field errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from inferd.batchjobs import OpenAIBatches
from inferd.batchjobs import _openai
from inferd.clock import FakeClock
from inferd.errors import InferdError, InvalidArgument, NotFound, TooLarge, Unavailable

WAIT = 10.0


class Lines:
    """The injected line runner: answers ``{"echo": body}``; ``fail`` maps a body's tag to what it raises
    (once), ``gate`` (when set) holds every line until the test releases it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: dict[str, BaseException] = {}
        self.gate: asyncio.Event | None = None

    async def answer(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(body["tag"])
        if self.gate is not None:
            await self.gate.wait()
        error = self.fail.pop(body["tag"], None)
        if error is not None:
            raise error
        return {"id": f"r-{body['tag']}", "echo": body, "url": url}

    def error(self, exc: BaseException) -> tuple[int, dict[str, Any]]:
        status = 404 if isinstance(exc, NotFound) else 500
        return status, {"error": {"message": exc.message if isinstance(exc, InferdError) else str(exc)}}


def jsonl(n: int, url: str = "/v1/embeddings") -> bytes:
    return b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url,
                                "body": {"tag": f"t{i}"}}).encode() + b"\n" for i in range(n))


def upload(store: OpenAIBatches, data: bytes, name: str = "upload-1") -> str:
    store.uploads.mkdir(parents=True, exist_ok=True)
    (store.uploads / name).write_bytes(data)
    return name


async def started(tmp_path, lines: Lines, clock: FakeClock | None = None) -> OpenAIBatches:
    store = OpenAIBatches(tmp_path, lines, clock)
    await store.start()
    return store


def answers(store: OpenAIBatches, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in store.content(file_id).read_bytes().splitlines()]


async def test_an_upload_becomes_a_file_and_leaves_the_uploads_folder(tmp_path):
    store = await started(tmp_path, Lines())
    file = store.create_file("in.jsonl", "batch", upload(store, jsonl(2)))
    assert (file["object"], file["purpose"], file["bytes"], file["filename"]) == ("file", "batch", len(jsonl(2)),
                                                                                  "in.jsonl")
    assert store.content(file["id"]).read_bytes() == jsonl(2) and list(store.uploads.iterdir()) == []
    assert store.file(file["id"]) == file and store.list_files("batch")["data"] == [file]
    with pytest.raises(InvalidArgument, match="'purpose' must be 'batch'"):
        store.create_file("x.jsonl", "fine-tune", upload(store, b"{}\n"))
    assert list(store.uploads.iterdir()) == []  # refused: its bytes go too
    with pytest.raises(NotFound, match="no upload named"):
        store.create_file("x.jsonl", "batch", "upload-nope")
    with pytest.raises(NotFound, match="no upload named"):
        store.create_file("x.jsonl", "batch", "../files")  # never a path out of the folder
    with pytest.raises(NotFound, match="No such File object: 'file-nope'"):
        store.file("file-nope")
    await store.stop()


async def test_an_upload_over_the_limit_is_too_large(tmp_path, monkeypatch):
    monkeypatch.setattr(_openai, "OPENAI_MAX_FILE_BYTES", 10)
    store = await started(tmp_path, Lines())
    with pytest.raises(TooLarge, match="more than 10 bytes"):
        store.create_file("big.jsonl", "batch", upload(store, jsonl(1)))
    assert list(store.uploads.iterdir()) == [] and store.list_files(None)["data"] == []
    await store.stop()


async def test_every_line_is_answered_once_errors_in_the_error_file(tmp_path):
    lines = Lines()
    lines.fail = {"t1": NotFound("The model 'nope' is not found")}
    store = await started(tmp_path, lines)
    file = store.create_file("in.jsonl", "batch", upload(store, jsonl(4)))
    batch = store.create_batch(file["id"], "/v1/embeddings", {"run": "1"})
    assert batch["status"] == "in_progress" and batch["metadata"] == {"run": "1"}
    await asyncio.wait_for(store.jobs.wait(batch["id"]), WAIT)
    done = store.batch(batch["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert done["completed_at"] is not None and done["output_file_id"] and done["error_file_id"]
    out = answers(store, done["output_file_id"])
    assert sorted(a["custom_id"] for a in out) == ["c0", "c2", "c3"]
    assert out[0]["response"]["status_code"] == 200 and out[0]["response"]["body"]["url"] == "/v1/embeddings"
    assert out[0]["response"]["request_id"] == out[0]["response"]["body"]["id"]
    assert out[0]["id"].startswith("batch_req_")
    [refused] = answers(store, done["error_file_id"])
    assert refused["custom_id"] == "c1" and refused["response"]["status_code"] == 404
    assert store.file(done["output_file_id"])["purpose"] == "batch_output"
    assert store.file(done["output_file_id"])["filename"] == f"{batch['id']}_output.jsonl"
    await store.stop()


async def test_a_line_refused_unavailable_runs_again_after_the_engines_delay(tmp_path):
    lines, clock = Lines(), FakeClock()
    lines.fail = {"t0": Unavailable("model 'm' is loading")}
    store = await started(tmp_path, lines, clock)
    file = store.create_file("in.jsonl", "batch", upload(store, jsonl(1)))
    batch = store.create_batch(file["id"], "/v1/embeddings", None)
    for _ in range(20):
        await asyncio.sleep(0)
    assert lines.calls == ["t0"] and store.batch(batch["id"])["status"] == "in_progress"
    clock.advance(0.5)  # the first retry delay
    await asyncio.wait_for(store.jobs.wait(batch["id"]), WAIT)
    assert lines.calls == ["t0", "t0"] and store.batch(batch["id"])["request_counts"]["completed"] == 1
    await store.stop()


async def test_a_file_that_fails_the_check_makes_a_failed_batch(tmp_path):
    store = await started(tmp_path, Lines())
    data = jsonl(1) + json.dumps({"custom_id": "c0", "method": "GET", "url": "/v1/completions", "body": {}}).encode()
    file = store.create_file("bad.jsonl", "batch", upload(store, data + b"\n"))
    batch = store.create_batch(file["id"], "/v1/embeddings", None)
    assert batch["status"] == "failed" and batch["failed_at"] is not None and batch["output_file_id"] is None
    assert {(e["line"], e["code"], e["param"]) for e in batch["errors"]["data"]} == {
        (2, "duplicate_custom_id", "custom_id"), (2, "invalid_request", "method"), (2, "mismatched_endpoint", "url")}
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    with pytest.raises(InvalidArgument, match="Cannot cancel a batch with status 'failed'"):
        await store.cancel(batch["id"])
    await store.stop()


async def test_cancel_ends_the_lines_in_flight_and_frees_the_input(tmp_path):
    lines = Lines()
    lines.gate = asyncio.Event()  # never set: the lines would run for ever
    store = await started(tmp_path, lines)
    file = store.create_file("in.jsonl", "batch", upload(store, jsonl(40)))
    batch = store.create_batch(file["id"], "/v1/embeddings", None)
    while len(lines.calls) < _openai.IN_FLIGHT:
        await asyncio.sleep(0.01)
    with pytest.raises(InvalidArgument, match=f"input of batch '{batch['id']}'"):
        store.delete_file(file["id"])
    cancelled = await asyncio.wait_for(store.cancel(batch["id"]), WAIT)
    assert cancelled["status"] == "cancelled" and cancelled["cancelling_at"] is not None
    assert cancelled["cancelled_at"] is not None and cancelled["request_counts"]["completed"] == 0
    assert len(lines.calls) == _openai.IN_FLIGHT  # at most IN_FLIGHT ran; none after the cancel
    assert (await store.cancel(batch["id"]))["status"] == "cancelled"  # again: nothing changes
    assert store.delete_file(file["id"]) == {"id": file["id"], "object": "file", "deleted": True}
    with pytest.raises(NotFound):
        store.content(file["id"])
    await store.stop()


async def test_batches_list_newest_first_a_page_after_an_id(tmp_path):
    store = await started(tmp_path, Lines())
    file = store.create_file("in.jsonl", "batch", upload(store, jsonl(1)))
    ids = []
    for _ in range(3):
        ids.append(store.create_batch(file["id"], "/v1/embeddings", None)["id"])
        await asyncio.wait_for(store.jobs.wait(ids[-1]), WAIT)
    listed = store.list_batches(None, 100)
    assert {b["id"] for b in listed["data"]} == set(ids) and not listed["has_more"]
    first = store.list_batches(None, 1)
    assert first["has_more"] and first["first_id"] == first["last_id"] == listed["data"][0]["id"]
    rest = store.list_batches(first["last_id"], 100)
    assert [b["id"] for b in rest["data"]] == [b["id"] for b in listed["data"][1:]]
    with pytest.raises(InvalidArgument, match="'after' must be the id of a batch"):
        store.list_batches("batch_nope", 10)
    with pytest.raises(NotFound, match="No such Batch object: 'batch_nope'"):
        store.batch("batch_nope")
    await store.stop()


async def test_a_batch_whose_input_cannot_be_read_back_fails_saying_why(tmp_path):
    """Its input is read line by line as it runs: a file gone, or changed under it, ends it ``failed``."""
    lines = Lines()
    lines.gate = asyncio.Event()
    store = await started(tmp_path, lines)
    file = store.create_file("in.jsonl", "batch", upload(store, jsonl(2)))
    gone = store.create_batch(file["id"], "/v1/embeddings", None)
    other = store.create_file("in2.jsonl", "batch", upload(store, jsonl(2), "upload-2"))
    changed = store.create_batch(other["id"], "/v1/embeddings", None)
    while len(lines.calls) < 4:
        await asyncio.sleep(0.01)
    await store.stop()  # both stay in progress, to resume
    (store.files / file["id"] / "content").unlink()
    with open(store.files / other["id"] / "content", "ab") as f:
        f.write(b"{not json\n")  # past the lines already read: met by the resumed run
    lines.gate.set()
    again = await started(tmp_path, lines)
    for batch in (gone, changed):
        await asyncio.wait_for(again.jobs.wait(batch["id"]), WAIT)
    failed = again.batch(gone["id"])
    assert failed["status"] == "failed" and failed["failed_at"] is not None
    [error] = failed["errors"]["data"]
    assert "input file" in error["message"] and error["code"] == "server_error"
    broken = again.batch(changed["id"])
    assert broken["status"] == "failed" and "JSONDecodeError" in broken["errors"]["data"][0]["message"]
    await again.stop()
