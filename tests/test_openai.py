"""The OpenAI-compatible routes (/v1) through the official ``openai`` client, sync and async, against a real
server over the example generator (a chat model: byte GRU, byte tokenizer, chat template) and text encoder
(embeddings): answers equal to the same work through /v2, n > 1, stop strings, usage, streaming with
include_usage, a disconnect freeing its row, OpenAI's error body for bad requests, and the API key."""

from __future__ import annotations

import base64
import shutil
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")

from conftest import running  # noqa: E402
from inferd.examples import generator_assets as generator, text_assets  # noqa: E402
from inferd.examples.build import build_repository  # noqa: E402

KEY = "test-key-27"
SHORT = 5  # short_generator's own max_new_tokens
BODY_LIMIT = 1 << 20  # the server's --http-max-input-size


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openai")
    build_repository(repo, only=["generator", "text_encoder"], log=None)
    # The generator again, with no limit of its own on a sequence's length: a stream the client leaves stays
    # long enough in the model for its disconnect to be what ends it.
    long = repo / "long_generator"
    shutil.copytree(repo / "generator", long)
    (long / "config.pbtxt").write_text(generator.config("long_generator", max_new_tokens=10**7, openai=True)
                                       .replace('"inferd.openai.max_context" value: { string_value: "2048"',
                                                '"inferd.openai.max_context" value: { string_value: "0"'))
    # And with a limit of its own well below any request's: a completion it cuts is finish_reason "length".
    short = repo / "short_generator"
    shutil.copytree(repo / "generator", short)
    (short / "config.pbtxt").write_text(generator.config("short_generator", max_new_tokens=SHORT, openai=True))
    key_file = repo.parent / "openai-keys"
    key_file.write_text(f"{KEY}\n")
    args = ["--openai-api-key-file", str(key_file), "--http-max-input-size", str(BODY_LIMIT)]
    with running(repo, extra_args=args) as server:
        server.repo = repo
        yield server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def _post(server, path: str, doc, headers=None) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(doc).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _generated(server, prompt: str | bytes, max_tokens: int, model: str = "generator") -> str:
    """The generator's greedy text for ``prompt`` (text, or the very bytes the model reads) through /v2
    (ModelStreamInfer over gRPC), as /v1 decodes it."""
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    try:
        x = grpcclient.InferInput("PROMPT", [1, 1], "BYTES")
        x.set_data_from_numpy(np.array([[prompt.encode() if isinstance(prompt, str) else prompt]], dtype=np.object_))
        client.async_stream_infer(model, [x], parameters={"max_tokens": max_tokens},
                                  enable_empty_final_response=True)
        out = b""
        while True:
            item = responses.get(timeout=60)
            if isinstance(item, Exception):
                raise item
            response = item.get_response()
            if response.outputs:
                out += item.as_numpy("TEXT").reshape(-1)[0]
            if response.parameters["triton_final_response"].bool_param:
                return out.decode("utf-8", errors="replace")
    finally:
        client.stop_stream()
        client.close()


def _chat_prompt(content: str) -> str:
    return f"{text_assets.BOS_TOKEN}<|user|>\n{content}{text_assets.EOS_TOKEN}\n<|assistant|>\n"


def _stats(server, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=30) as response:
        return json.loads(response.read())["model_stats"][0]


def test_models_listed_and_retrieved(client):
    ids = {m.id for m in client.models.list()}
    assert ids == {"generator", "long_generator", "short_generator", "text_encoder"}
    assert client.models.retrieve("generator").id == "generator"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no_such_model")
    assert info.value.code == "model_not_found"


def test_chat_completion_is_the_models_own_text(server, client):
    """Non-streamed chat: the content is what the model generates for the template's prompt through /v2,
    usage counts the prompt's tokens (the byte tokenizer: its bytes) and the completion's."""
    reply = client.chat.completions.create(model="generator", messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=12)
    prompt = _chat_prompt("Hello")
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == _generated(server, prompt, 12)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(prompt.encode())
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == len(prompt.encode()) + 12
    # Time to first token and per output token, in the core's /metrics whichever frontend took the call.
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        metrics = response.read().decode()
    counts = {name: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              for name in ("first", "inter")
              if line.startswith(f'inferd_stream_{name}_response_duration_seconds_count{{model="generator"')}
    assert counts["first"] >= 1 and counts["inter"] >= 11, counts


def _token_counters(server, model: str) -> tuple[float, float]:
    """inferd_openai_{prompt,completion}_tokens_total of ``model`` on the core's /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        metrics = response.read().decode()
    found = {name: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
             for name in ("prompt", "completion")
             if line.startswith(f'inferd_openai_{name}_tokens_total{{model="{model}"')}
    return found["prompt"], found["completion"]


def test_token_counters_at_metrics_are_the_usage(server, client):
    """/metrics counts a /v1 call's tokens in the core as its usage does (two choices of one prompt: the
    prompt once, both completions), whichever frontend took it; a /v2 stream to the same model counts none."""
    before = _token_counters(server, "generator")
    reply = client.chat.completions.create(model="generator", messages=[{"role": "user", "content": "Count"}],
                                           max_tokens=5, n=2, temperature=1.0, seed=3)
    after = _token_counters(server, "generator")
    assert reply.usage.prompt_tokens == len(_chat_prompt("Count").encode())
    assert reply.usage.completion_tokens == 10
    assert (after[0] - before[0], after[1] - before[1]) == (reply.usage.prompt_tokens, reply.usage.completion_tokens)
    _generated(server, _chat_prompt("Count"), 4)  # /v2: not a /v1 request, whatever it sends
    assert _token_counters(server, "generator") == after


async def test_streamed_chat_async_equals_unstreamed(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    whole = client.chat.completions.create(model="generator", messages=messages, max_tokens=10)
    async with openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1", api_key=KEY, max_retries=0) as aclient:
        stream = await aclient.chat.completions.create(model="generator", messages=messages, max_tokens=10,
                                                       stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_streamed_with_n_choices_and_seed(client):
    """n = 3 sampled choices from one seed: each its own text, the same again for the same seed."""
    def run() -> dict[int, str]:
        texts = {0: "", 1: "", 2: ""}
        for chunk in client.completions.create(model="generator", prompt="Once upon", max_tokens=16, n=3,
                                               temperature=1.0, seed=7, stream=True):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
        return texts

    first, second = run(), run()
    assert first == second
    assert len(set(first.values())) == 3, first
    whole = client.completions.create(model="generator", prompt="Once upon", max_tokens=16, n=3, temperature=1.0,
                                      seed=7)
    assert {c.index: c.text for c in whole.choices} == first
    assert whole.usage.completion_tokens == 48


def test_stop_string_ends_the_choice(server, client):
    """The choice ends at the stop string, and its request counts as a success in the model's statistics
    and /metrics, not as a cancellation (issue 47: the stream closed on a stop is no client gone)."""
    full = client.completions.create(model="generator", prompt="abc", max_tokens=40).choices[0].text
    stop = next(full[i:i + 2] for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2])
    canceled = '{model="generator",version="1",reason="CANCELED"}'
    before, cancels = _stats(server, "generator")["inference_stats"], server.metric("nv_inference_request_failure", canceled)
    reply = client.completions.create(model="generator", prompt="abc", max_tokens=40, stop=[stop, "never-seen"])
    assert reply.choices[0].text == full[:full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < 40
    deadline = time.monotonic() + 60
    while True:  # a frontend worker's CANCEL reaches the core after the answer went out
        after = _stats(server, "generator")["inference_stats"]
        ended = {k: int(after[k]["count"]) - int(before[k]["count"]) for k in ("success", "fail")}
        if sum(ended.values()) >= 1:
            break
        assert time.monotonic() < deadline, "the stopped request was never counted"
        time.sleep(0.02)
    assert ended == {"success": 1, "fail": 0}
    assert server.metric("nv_inference_request_failure", canceled) == cancels


def test_token_id_prompt_and_echo(server, client):
    tokenizer = tokenizers.Tokenizer.from_file(str(server.repo / "generator" / "tokenizer.json"))
    by_text = client.completions.create(model="generator", prompt="Hey", max_tokens=5)
    by_ids = client.completions.create(model="generator", prompt=tokenizer.encode("Hey").ids, max_tokens=5, echo=True)
    assert by_ids.choices[0].text == "Hey" + by_text.choices[0].text


def test_token_ids_cut_inside_a_character_reach_the_model_as_given(server, client):
    """A prompt of ids that ends inside a multi-byte character (not UTF-8 on its own) is sent as the bytes
    those ids stand for, and usage counts the ids given: the model reads the very tokens the client sent,
    not a replacement character re-encoded into other ones."""
    tokenizer = tokenizers.Tokenizer.from_file(str(server.repo / "generator" / "tokenizer.json"))
    ids = tokenizer.encode("caf\u00e9").ids[:-1]  # 'c', 'a', 'f' and the first byte of the e-acute
    assert len(ids) == 4 and bytes(b"caf\xc3").decode("utf-8", errors="replace") == "caf\ufffd"
    reply = client.completions.create(model="generator", prompt=ids, max_tokens=6)
    assert reply.usage.prompt_tokens == 4
    assert reply.choices[0].text == _generated(server, b"caf\xc3", 6)


def test_a_completion_the_model_cuts_at_its_own_limit_is_length(server, client):
    """short_generator stops every sequence after its own max_new_tokens (5): a completion it cut there
    reports finish_reason "length", as OpenAI and vLLM report a cut answer, streamed or not."""
    prompt = "The quick brown fox"
    # The same weights go on past SHORT bytes for this prompt: short_generator's stop there is its own limit.
    assert client.completions.create(model="generator", prompt=prompt, max_tokens=SHORT + 3).usage.completion_tokens \
        == SHORT + 3
    reply = client.completions.create(model="short_generator", prompt=prompt, max_tokens=50)
    assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (SHORT, "length")
    reasons = [c.choices[0].finish_reason for c in client.completions.create(
        model="short_generator", prompt=prompt, max_tokens=50, stream=True) if c.choices[0].finish_reason]
    assert reasons == ["length"]


def test_finish_reason_is_length_at_either_limit() -> None:
    from inferd.facade import OpenAISpec
    from inferd.frontends.openai._generate import Sampling, finish_reason

    spec = OpenAISpec("completion", "", max_new_tokens=5)
    assert finish_reason(5, Sampling(max_tokens=50), spec) == "length"  # the model's own limit
    assert finish_reason(3, Sampling(max_tokens=3), spec) == "length"  # the request's
    assert finish_reason(4, Sampling(max_tokens=50), spec) == "stop"  # the model ended it
    assert finish_reason(9, Sampling(), OpenAISpec("completion", "")) == "stop"  # no limit known


def test_v1_errors_before_any_route_are_openais(server, client):
    """A body over --http-max-input-size and an unknown /v1 path answer OpenAI's error body, which the
    openai client reads (message, type), not KServe's."""
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="generator", prompt="x" * (BODY_LIMIT + 1), max_tokens=1)
    assert info.value.status_code == 413
    assert info.value.type == "invalid_request_error" and "--http-max-input-size" in info.value.message
    status, body = _post(server, "/v1/no/such/route", {"model": "generator"}, {"Authorization": f"Bearer {KEY}"})
    assert (status, body) == (404, {"error": {"message": "Invalid URL (POST /v1/no/such/route)",
                                              "type": "invalid_request_error", "param": None, "code": None}})
    status, body = _post(server, "/v2/no/such/route", {})
    assert status == 404 and isinstance(body["error"], str)  # KServe's, as before


def _v2_embedding(server, ids: list[int]) -> list[float]:
    doc = {"inputs": [{"name": "INPUT_IDS", "datatype": "INT64", "shape": [1, len(ids)], "data": ids}]}
    status, body = _post(server, "/v2/models/text_encoder/infer", doc)
    assert status == 200, body
    return body["outputs"][0]["data"]


def test_embeddings_equal_v2_inference(server, client):
    tokenizer = tokenizers.Tokenizer.from_file(str(server.repo / "text_encoder" / "tokenizer.json"))
    texts = ["Beautiful is better than ugly.", "hello"]
    reply = client.embeddings.create(model="text_encoder", input=texts)
    assert [d.index for d in reply.data] == [0, 1]
    ids = [tokenizer.encode(t).ids for t in texts]
    for data, row in zip(reply.data, ids):
        np.testing.assert_allclose(data.embedding, _v2_embedding(server, row), rtol=1e-5, atol=1e-6)
    assert reply.usage.prompt_tokens == sum(len(r) for r in ids)
    by_ids = client.embeddings.create(model="text_encoder", input=ids[0])
    np.testing.assert_allclose(by_ids.data[0].embedding, reply.data[0].embedding, rtol=1e-6)
    # base64: float32 little-endian, the same values
    status, body = _post(server, "/v1/embeddings", {"model": "text_encoder", "input": texts[1],
                                                    "encoding_format": "base64"},
                         {"Authorization": f"Bearer {KEY}"})
    assert status == 200, body
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, reply.data[1].embedding, rtol=1e-6)
    short = client.embeddings.create(model="text_encoder", input=texts[1], dimensions=16)
    np.testing.assert_allclose(short.data[0].embedding, reply.data[1].embedding[:16], rtol=1e-6)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="text_encoder", input="x", dimensions=10)
    assert info.value.param == "dimensions" and "16, 32, 64" in info.value.message


def test_bad_requests_answer_openais_error_shape(server, client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found" and "missing" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="generator", messages=[{"role": "user", "content": "x"}],
                                       temperature="hot")  # type: ignore[arg-type]
    assert info.value.param == "temperature" and '"hot"' in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="generator", prompt="x" * 2100, max_tokens=4)
    assert info.value.code == "context_length_exceeded" and "2048" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="generator", input="x")
    assert info.value.param == "model"
    status, body = _post(server, "/v1/chat/completions", {"model": "generator", "messages": [{"role": "robot"}]},
                         {"Authorization": f"Bearer {KEY}"})
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and "role" in body["error"]["message"]
    status, body = _post(server, "/v1/completions", {"model": "generator", "prompt": "x", "n": 2, "unknown": {}},
                         {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and len(body["choices"]) == 2  # unknown fields are ignored, as OpenAI does
    status, body = _post(server, "/v1/completions", {"model": "generator", "prompt": "x"},
                         {"Authorization": f"Bearer {KEY}", "inferd-priority": "high"})
    assert status == 400 and "inferd-priority" in body["error"]["message"], body
    status, body = _post(server, "/v1/completions", {"model": "generator", "prompt": ["a"] * 20, "n": 16},
                         {"Authorization": f"Bearer {KEY}"})
    assert status == 400 and body["error"]["param"] == "n" and "320 choices" in body["error"]["message"], body


def test_api_key_is_required(server):
    with openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.models.list()
    assert info.value.code == "invalid_api_key"
    status, body = _post(server, "/v1/completions", {"model": "generator", "prompt": "x"})
    assert status == 401 and body["error"]["type"] == "authentication_error"


def test_disconnect_mid_stream_frees_its_row(server, client):
    """A client that goes away mid-stream: its sequence leaves at the next step (it is counted as ended long
    before its max_tokens), and a request after it runs alone (batch size 1)."""
    model = "long_generator"
    before = _stats(server, model)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "go"}],
                                            max_tokens=10**6, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while True:  # the cancelled sequence counted as ended (a failure: cancelled)
        now = _stats(server, model)
        ended = sum(int(now["inference_stats"][k]["count"]) - int(before["inference_stats"][k]["count"])
                    for k in ("success", "fail"))
        if ended >= 1:
            break
        assert time.monotonic() < deadline, f"the stream's sequence still runs 60 s after its client left: {now}"
        time.sleep(0.02)
    assert int(now["execution_count"]) - int(before["execution_count"]) < 10**6
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "alone"}], max_tokens=6)
    after = _stats(server, model)

    def by_size(stats: dict) -> dict[int, int]:
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}

    grew = {size: count - by_size(now).get(size, 0) for size, count in by_size(after).items()
            if count != by_size(now).get(size, 0)}
    steps = int(after["execution_count"]) - int(now["execution_count"])
    assert steps >= 6 and grew == {1: steps}, grew
