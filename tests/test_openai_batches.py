"""OpenAI's Batch API on /v1 through the official ``openai`` client against a real server (the example
generator as a chat model): a file uploaded, a batch run, its output file's answers equal to the same
requests answered one by one, a refused line in the error file, a file that fails validation, bad
batch requests in OpenAI's error shape, a cancel that ends lines the model would run for ever; and,
without a server, a batch that stops half-way resumed by the next store with each line answered once."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")
pytest.importorskip("python_multipart")

from conftest import running  # noqa: E402
from inferd.examples import generator_assets as generator  # noqa: E402
from inferd.examples.build import build_repository  # noqa: E402
from inferd.frontends.openai._batches import BatchStore  # noqa: E402

WAIT_S = 90  # the longest a test waits for a batch to end


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openai_batches")
    build_repository(repo, only=["generator"], log=None)
    long = repo / "long_generator"  # a sequence with no length limit: runs until it is cancelled
    shutil.copytree(repo / "generator", long)
    (long / "config.pbtxt").write_text(generator.config("long_generator", max_new_tokens=10**7, openai=True)
                                       .replace('"inferd.openai.max_context" value: { string_value: "2048"',
                                                '"inferd.openai.max_context" value: { string_value: "0"'))
    with running(repo) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _chat_line(custom_id: str, content: str, model: str = "generator", max_tokens: int = 4) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}}


def _until(client, batch_id: str, statuses: tuple[str, ...]):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status} after {WAIT_S} s"
        time.sleep(0.1)


def test_batch_answers_equal_the_same_requests_one_by_one(client):
    lines = [_chat_line("a", "Beautiful is"), _chat_line("b", "Flat is better"), _chat_line("c", "hi", "nope")]
    upload = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    assert (upload.purpose, upload.bytes, upload.filename) == ("batch", len(_jsonl(lines)), "in.jsonl")
    assert client.files.retrieve(upload.id).bytes == upload.bytes
    assert client.files.content(upload.id).read() == _jsonl(lines)

    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "t27b"})
    assert batch.status in ("in_progress", "completed") and batch.metadata == {"run": "t27b"}
    done = _until(client, batch.id, ("completed", "failed", "cancelled"))
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 2, 1)
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]

    answers = {}
    for raw in client.files.content(done.output_file_id).read().splitlines():
        doc = json.loads(raw)
        answers[doc["custom_id"]] = doc
    assert sorted(answers) == ["a", "b"]
    for line in lines[:2]:
        answer = answers[line["custom_id"]]
        assert answer["response"]["status_code"] == 200 and answer["error"] is None
        direct = client.chat.completions.create(**line["body"])
        body = answer["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"] == direct.usage.model_dump(exclude_none=True)
        assert body["choices"][0]["message"]["content"] == direct.choices[0].message.content != ""
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"

    [refused] = [json.loads(raw) for raw in client.files.content(done.error_file_id).read().splitlines()]
    assert refused["custom_id"] == "c" and refused["response"]["status_code"] == 404
    assert refused["response"]["body"]["error"]["code"] == "model_not_found"
    assert "nope" in refused["response"]["body"]["error"]["message"]


def test_completions_batch_answers_unstreamed(client):
    body = {"model": "generator", "prompt": "Now is better", "max_tokens": 5, "n": 2, "echo": True}
    line = {"custom_id": "only", "method": "POST", "url": "/v1/completions",
            "body": {**body, "stream": True, "stream_options": {"include_usage": True}}}  # a line is never streamed
    upload = client.files.create(file=("c.jsonl", _jsonl([line])), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    done = _until(client, batch.id, ("completed", "failed", "cancelled"))
    assert done.status == "completed" and done.error_file_id is None
    [answer] = [json.loads(raw) for raw in client.files.content(done.output_file_id).read().splitlines()]
    direct = client.completions.create(**body)
    got = answer["response"]["body"]
    assert got["object"] == "text_completion"
    assert [c["text"] for c in got["choices"]] == [c.text for c in direct.choices]
    assert got["choices"][0]["text"].startswith("Now is better")


def test_invalid_file_fails_the_batch_naming_its_lines(client):
    lines = [_chat_line("a", "x"), {**_chat_line("a", "y"), "url": "/v1/embeddings"}, {"custom_id": "z"}]
    upload = client.files.create(file=("bad.jsonl", _jsonl(lines) + b"{not json\n"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.output_file_id is None
    errors = {(e.line, e.code, e.param) for e in batch.errors.data}
    assert errors == {(2, "duplicate_custom_id", "custom_id"), (2, "mismatched_endpoint", "url"),
                      (3, "invalid_request", "method"), (3, "invalid_url", "url"),
                      (3, "invalid_request", "body"), (4, "invalid_json_line", None)}, errors


def test_bad_batch_requests_answer_openais_error_shape(client):
    upload = client.files.create(file=("in.jsonl", _jsonl([_chat_line("a", "x")])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(input_file_id=upload.id, endpoint="/v1/moderations", completion_window="24h")
    assert bad.value.body["param"] == "endpoint" and "/v1/embeddings" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="1h")
    assert bad.value.body["param"] == "completion_window" and "'1h'" in bad.value.body["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")
    assert "file-nope" in missing.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("in.jsonl", b"{}\n"), purpose="fine-tune")
    assert bad.value.body["param"] == "purpose" and "'fine-tune'" in bad.value.body["message"]


def test_cancel_ends_the_lines_in_flight(client):
    lines = [_chat_line(f"long{i}", "go", "long_generator", max_tokens=10**6) for i in range(2)]
    upload = client.files.create(file=("long.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "in_progress"
    with pytest.raises(openai.BadRequestError) as refused:  # its input stays while it runs
        client.files.delete(upload.id)
    assert batch.id in refused.value.body["message"]
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    done = _until(client, batch.id, ("cancelled",))  # the lines would never end by themselves
    assert done.cancelled_at is not None and done.request_counts.completed == 0
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: nothing changes
    bad = client.files.create(file=("bad.jsonl", b"{}\n"), purpose="batch")
    failed = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as refused:  # a batch that ended otherwise cannot be cancelled
        client.batches.cancel(failed.id)
    assert "'failed'" in refused.value.body["message"]
    assert upload.id in [f.id for f in client.files.list(purpose="batch").data]
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)
    assert upload.id not in [f.id for f in client.files.list().data]


async def test_a_stopped_batch_resumes_answering_each_line_once(tmp_path):
    gate = asyncio.Event()
    calls: list[str] = []

    async def answer(url: str, body: dict) -> dict:
        calls.append(body["tag"])
        if body["tag"] >= "l3":
            await gate.wait()  # the first store stops before these answer
        return {"id": f"r-{body['tag']}", "tag": body["tag"]}

    async def chunks(data: bytes):  # type: ignore[no-untyped-def]
        yield data

    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings", "body": {"tag": f"l{i}"}}
             for i in range(6)]
    first = BatchStore(tmp_path, answer)
    upload = await first.create_file("in.jsonl", "batch", chunks(_jsonl(lines)))
    batch = await first.create_batch({"input_file_id": upload["id"], "endpoint": "/v1/embeddings",
                                      "completion_window": "24h"})
    while len(calls) < 6:  # l0..l2 answered, l3..l5 waiting at the gate
        await asyncio.sleep(0.01)
    await first.stop()
    assert first.batch(batch["id"])["status"] == "in_progress"
    assert first.batch(batch["id"])["request_counts"] == {"total": 6, "completed": 3, "failed": 0}

    gate.set()
    second = BatchStore(tmp_path, answer)
    await second.resume()
    await asyncio.gather(*second._tasks.values())
    done = second.batch(batch["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    out = [json.loads(raw) for raw in second.content(done["output_file_id"]).read_bytes().splitlines()]
    assert sorted(d["custom_id"] for d in out) == [f"c{i}" for i in range(6)]  # each once
    assert calls == [f"l{i}" for i in range(6)] + ["l3", "l4", "l5"]  # only the unanswered ran again
