"""OpenAI's Batch API on /v1 through the official ``openai`` client against a real server (the example
generator as a chat model): a file uploaded, a batch run, its output file's answers equal to the same
requests answered one by one, a refused line in the error file, a file that fails validation, bad
batch requests in OpenAI's error shape, a cancel that ends lines the model would run for ever; and,
without a server, a batch that stops half-way resumed by the next store with each line answered once
(the core's OpenAIBatches, which the server runs every batch in)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")
pytest.importorskip("python_multipart")

from conftest import ServerProcess, running  # noqa: E402
from inferd.dataplane import DataPlane  # noqa: E402
from inferd.frontends.openai import BatchLines  # noqa: E402
from inferd.repository import ModelManager  # noqa: E402
from inferd.examples import generator_assets as generator  # noqa: E402
from inferd.examples.build import build_repository  # noqa: E402
from inferd.batchjobs import OpenAIBatches  # noqa: E402

WAIT_S = 90  # the longest a test waits for a batch to end


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openai_batches")
    build_repository(repo, only=["generator"], log=None)
    long = repo / "long_generator"  # a sequence with no length limit: runs until it is cancelled
    shutil.copytree(repo / "generator", long)
    (long / "config.pbtxt").write_text(generator.config("long_generator", max_new_tokens=10**7, openai=True)
                                       .replace('"inferd.openai.max_context" value: { string_value: "2048"',
                                                '"inferd.openai.max_context" value: { string_value: "0"'))
    return repo


@pytest.fixture(scope="module")
def server(repo):
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


def _until(client, batch_id: str, statuses: tuple[str, ...], also=lambda batch: False):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or also(batch):
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

    class Lines:  # the injected line runner (the server's: BatchLines, the /v1 translation)
        async def answer(self, url: str, body: dict) -> dict:
            calls.append(body["tag"])
            if body["tag"] >= "l3":
                await gate.wait()  # the first store stops before these answer
            return {"id": f"r-{body['tag']}", "tag": body["tag"]}

        def error(self, exc: BaseException) -> tuple[int, dict]:
            raise AssertionError(f"no line fails here: {exc!r}")

    def upload(store: OpenAIBatches, data: bytes) -> str:
        store.uploads.mkdir(parents=True, exist_ok=True)
        (store.uploads / "upload-1").write_bytes(data)
        return "upload-1"

    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings", "body": {"tag": f"l{i}"}}
             for i in range(6)]
    first = OpenAIBatches(tmp_path, Lines())
    await first.start()
    file = first.create_file("in.jsonl", "batch", upload(first, _jsonl(lines)))
    batch = first.create_batch(file["id"], "/v1/embeddings", None)
    while len(calls) < 6:  # l0..l2 answered, l3..l5 waiting at the gate
        await asyncio.sleep(0.01)
    await first.stop()
    assert first.batch(batch["id"])["status"] == "in_progress"
    assert first.batch(batch["id"])["request_counts"] == {"total": 6, "completed": 3, "failed": 0}

    gate.set()
    second = OpenAIBatches(tmp_path, Lines())
    await second.start()
    await second.jobs.wait(batch["id"])
    done = second.batch(batch["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    out = [json.loads(raw) for raw in second.content(done["output_file_id"]).read_bytes().splitlines()]
    assert sorted(d["custom_id"] for d in out) == [f"c{i}" for i in range(6)]  # each once
    assert calls == [f"l{i}" for i in range(6)] + ["l3", "l4", "l5"]  # only the unanswered ran again


async def test_batch_lines_run_in_the_core_as_background_requests(repo, tmp_path):
    """The server's wiring: OpenAI batch lines run through the /v1 translation over the core's own data
    plane (BatchLines), each request a background one, which the model's lane admits as batch work."""
    dp = DataPlane(ModelManager([repo], mode="explicit", startup_models=["generator"]), batch_dir=tmp_path,
                   openai_lines=BatchLines)
    await dp.load_models()
    try:
        store = dp.batches.openai
        lines = [_chat_line(f"c{i}", f"line {i}") for i in range(3)] + [_chat_line("x", "hi", "nope")]
        store.uploads.mkdir(parents=True, exist_ok=True)
        (store.uploads / "upload-1").write_bytes(_jsonl(lines))
        file = store.create_file("in.jsonl", "batch", "upload-1")
        batch = store.create_batch(file["id"], "/v1/chat/completions", None)
        await asyncio.wait_for(store.jobs.wait(batch["id"]), WAIT_S)
        done = store.batch(batch["id"])
        assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
        assert dp.manager.get("generator").scheduler.admitted == 3  # one sequence per line, through the lane
        [refused] = [json.loads(raw) for raw in store.content(done["error_file_id"]).read_bytes().splitlines()]
        assert refused["response"]["status_code"] == 404  # OpenAI's error shape, made in the core
        assert refused["response"]["body"]["error"]["code"] == "model_not_found"
    finally:
        await dp.stop_batches()
        await dp.close()


def test_a_batch_survives_a_killed_server_and_each_line_is_answered_once(repo, tmp_path):
    """The core owns a batch: killed mid-batch (no chance to tidy up), the next server on the same batch
    directory resumes it and runs only the lines without an answer."""
    # the lines step together and finish in order of their lengths: the kill comes after two (120 steps)
    # and 360 steps before the last
    lines = [_chat_line(f"c{i}", f"line {i}", "long_generator", max_tokens=60 * (i + 1)) for i in range(8)]
    first = ServerProcess(repo, ["--batch-dir", str(tmp_path)])
    try:
        with openai.OpenAI(base_url=f"http://{first.http_url}/v1", api_key="unused", max_retries=0) as c:
            upload = c.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
            batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                     completion_window="24h")
            part = _until(c, batch.id, ("completed",), lambda b: b.request_counts.completed >= 2)
        first.stop(signal.SIGKILL)
    finally:
        first.stop()
    assert part.status == "in_progress" and part.request_counts.completed < len(lines)
    second = ServerProcess(repo, ["--batch-dir", str(tmp_path)])
    try:
        with openai.OpenAI(base_url=f"http://{second.http_url}/v1", api_key="unused", max_retries=0) as c:
            done = _until(c, batch.id, ("completed", "failed", "cancelled"))
            out = [json.loads(raw) for raw in c.files.content(done.output_file_id).read().splitlines()]
    finally:
        second.stop()
    assert done.status == "completed" and done.request_counts.completed == len(lines), done
    ids = [a["custom_id"] for a in out]
    assert len(ids) == len(set(ids)) == len(lines)  # each once
    assert all(a["response"]["body"]["usage"]["completion_tokens"] == 60 * (int(a["custom_id"][1:]) + 1)
               for a in out)



def test_a_stop_ends_the_lines_in_flight_at_once_and_the_batch_resumes(repo, tmp_path):
    """A SIGTERM stops the batches before the server waits for its requests: lines that would run for ever do
    not hold the stop for its grace period (600 s here), and the next server takes the batch up again."""
    lines = [_chat_line(f"c{i}", "go", "long_generator", max_tokens=10**6) for i in range(2)]
    args = ["--batch-dir", str(tmp_path), "--exit-timeout-secs", "600"]
    first = ServerProcess(repo, args)
    try:
        with openai.OpenAI(base_url=f"http://{first.http_url}/v1", api_key="unused", max_retries=0) as c:
            upload = c.files.create(file=("long.jsonl", _jsonl(lines)), purpose="batch")
            batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                     completion_window="24h")
            deadline = time.monotonic() + WAIT_S
            inflight = ("inferd_inference_inflight_request_count", '{model="long_generator",version="1"}')
            while (first.metric(*inflight) or 0) < len(lines):  # both lines are in the core's model path
                assert time.monotonic() < deadline, first.log()
                time.sleep(0.05)
            assert c.batches.retrieve(batch.id).status == "in_progress"
    finally:
        code = first.stop(timeout=60)  # a graceful stop, well inside its grace
    assert code == 0, first.log()
    second = ServerProcess(repo, args)
    try:
        with openai.OpenAI(base_url=f"http://{second.http_url}/v1", api_key="unused", max_retries=0) as c:
            assert c.batches.retrieve(batch.id).status == "in_progress"  # resumed, not ended by the stop
            assert c.batches.cancel(batch.id).status == "cancelled"
    finally:
        assert second.stop(timeout=60) == 0
