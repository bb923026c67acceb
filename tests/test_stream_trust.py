"""Streams a client can trust, on a real server in each process mode: a model that
sends faster than its client reads is held back (its send waits) instead of filling
the server (a continuous-batching sequence is paused while the rest of its batch
steps on); a client that leaves cancels its stream down to the model
(``response_sender.is_cancelled()``); health answers meanwhile and SIGTERM ends the
process tree; a completed stream is one success, with ``response_stats`` per
response index, as Triton counts them.

Nothing here asserts a time: a bound on what the model could send while its client
read nothing, files the model writes at the moments that matter, and counts."""

from __future__ import annotations

import threading
import textwrap
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from conftest import running
from inferd.examples.build import triton_config

WAIT = 60  # bounds a hang only
FLOOD_COUNT = 3000  # responses the flood model tries to send
FLOAT_COUNT = 16384  # 64 KiB per response: the client's transport window holds only a few
STREAM_LIMIT = 4  # --stream-max-responses for these servers

# Sends up to COUNT responses as fast as it can, stopping once its request is cancelled.
# Writes <dir>/progress (responses sent so far) every 16 sends, and <dir>/cancelled.<n>
# when it sees the cancellation after n sends.
FLOOD_TEMPLATE = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def _progress(self, n):
        tmp = os.path.join(self.dir, "progress.tmp")
        with open(tmp, "w") as f:
            f.write(str(n))
        os.replace(tmp, os.path.join(self.dir, "progress"))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sent = 0
            while sent < count:
                if sender.is_cancelled():
                    assert request.is_cancelled()
                    open(os.path.join(self.dir, "cancelled.%d" % sent), "w").close()
                    break
                out = np.full([FLOATS], sent, dtype=np.float32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
                sent += 1
                if sent % 16 == 0:
                    self._progress(sent)
            self._progress(sent)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def flood_source(floats: int) -> str:
    """The flood model, each response ``floats`` FP32 values (bench/scenarios/flood.py uses it too)."""
    return FLOOD_TEMPLATE.replace("FLOATS", str(floats))

# Three responses, then the final flag alone (an empty final response).
THREE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for i in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x + i).astype(np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Not decoupled: one response per request.
PLAIN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros([1], np.float32) + x)]))
        return out
'''


# An iterative (continuous-batching) step model: each step sends one response of FLOATS FP32 values,
# all equal to the sequence's step number, and reschedules itself until IN steps are done. It counts
# each sequence's steps in <dir>/steps.<sequence id>.
ITER_FLOOD = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]
        self.steps = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            step = self.steps.get(key, 0)
            self.steps[key] = step + 1
            tmp = os.path.join(self.dir, "steps.tmp")
            with open(tmp, "w") as f:
                f.write(str(step + 1))
            os.replace(tmp, os.path.join(self.dir, "steps.%d" % key))
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            done = step + 1 >= count
            if not done:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            out = np.full([1, FLOATS], step, dtype=np.float32)
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)
        return None
'''
ITER_STEPS = 600  # steps of each iterative stream: well past what the bounds hold


def _python(repo: Path, name: str, source: str, out_dims: list[int], decoupled: bool = True) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))
    extra = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    (folder / "config.pbtxt").write_text(triton_config(
        name, [("IN", "TYPE_INT32", [1])], [("OUT", "TYPE_FP32", out_dims)], max_batch_size=0, platform=None,
        backend="python", extra=extra))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("stream_trust")
    _python(repo, "flood", flood_source(FLOAT_COUNT), [FLOAT_COUNT])
    _python(repo, "three", THREE, [1])
    _python(repo, "plain", PLAIN, [1], decoupled=False)
    folder = repo / "iter_flood"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(ITER_FLOOD.replace("FLOATS", str(FLOAT_COUNT)))
    (folder / "config.pbtxt").write_text(triton_config(
        "iter_flood", [("IN", "TYPE_INT32", [1])], [("OUT", "TYPE_FP32", [FLOAT_COUNT])], max_batch_size=4,
        platform=None, backend="python",
        extra="model_transaction_policy { decoupled: true }\nsequence_batching { iterative_sequence: true }\n"))
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator:
    # grpc.aio on the port: the bounds below count what inferd and the client hold of a stream; the gRPC
    # front (Envoy) holds up to a 1 MiB window of it more on each side.
    with running(repo, extra_args=["--stream-max-responses", str(STREAM_LIMIT), "--grpc-front", "grpcio"]) as server:
        yield server


def _request(model: str, value: int, sequence_id: int = 0) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    if sequence_id:
        request.parameters["sequence_id"].int64_param = sequence_id
        request.parameters["sequence_start"].bool_param = True
    shape = [1, 1] if model.startswith("iter") else [1]
    tensor = request.inputs.add(name="IN", datatype="INT32", shape=shape)
    request.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
    del tensor
    return request


class SlowStream:
    """A raw ModelStreamInfer call whose client reads only when told (no BDP probing, so
    gRPC's window stays at its initial 64 KiB: a response or two)."""

    def __init__(self, url: str, request: pb.ModelInferRequest) -> None:
        self.channel = grpc.insecure_channel(url, options=[("grpc.http2.bdp_probe", 0)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self._done = threading.Event()

        def requests_() -> Iterator[pb.ModelInferRequest]:
            yield request
            self._done.wait(WAIT * 2)  # keep the stream's sending side open

        self.call = self.stub.ModelStreamInfer(requests_())

    def read(self) -> pb.ModelStreamInferResponse:
        return next(self.call)

    def cancel(self) -> None:
        self.call.cancel()
        self._done.set()
        self.channel.close()


def _progress(repo: Path, model: str) -> int:
    try:
        return int((repo / model / "progress").read_text() or 0)
    except FileNotFoundError:
        return 0


def _wait_for(predicate, timeout: float = WAIT) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _reset(repo: Path, model: str) -> None:
    for f in (repo / model).glob("progress*"):
        f.unlink()
    for f in (repo / model).glob("cancelled.*"):
        f.unlink()


def test_a_client_that_stops_reading_holds_its_model_back_then_its_cancel_reaches_the_model(server, repo):
    _reset(repo, "flood")
    stream = SlowStream(server.url, _request("flood", FLOOD_COUNT))
    try:
        first = stream.read()
        assert not first.error_message
        assert np.frombuffer(first.infer_response.raw_output_contents[0], np.float32)[0] == 0
        # Unbounded, the model sends all 3,000 responses (190 MiB) in well under a second here. Held
        # back, it stops after what the server's bounds and the client's 64 KiB window hold: the
        # sink (4), the stream's write window (64), the hand-off's credit (64) and a few in transit.
        bound = STREAM_LIMIT + 2 * 64 + 100
        _wait_for(lambda: _progress(repo, "flood") >= FLOOD_COUNT, timeout=10)
        held = _progress(repo, "flood")
        assert held < bound, f"the model sent {held} responses to a client that read one"
        # The server answers meanwhile.
        live = requests.get(f"http://{server.http_url}/v2/health/live", timeout=WAIT)
        ready = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=WAIT)
        assert live.status_code == 200 and ready.status_code == 200
    finally:
        stream.cancel()
    assert _wait_for(lambda: any((repo / "flood").glob("cancelled.*"))), "the model never saw is_cancelled()"
    sent = int(next((repo / "flood").glob("cancelled.*")).name.split(".")[1])
    assert sent < bound
    client = grpcclient.InferenceServerClient(server.url)
    try:
        def counted() -> bool:
            stats = client.get_inference_statistics("flood").model_stats[0]
            return stats.inference_stats.fail.count == 1
        assert _wait_for(counted)
        stats = client.get_inference_statistics("flood").model_stats[0]
        assert stats.inference_stats.success.count == 0
        cancels = {k: v.cancel.count for k, v in stats.response_stats.items() if v.cancel.count}
        assert sum(cancels.values()) == 1, dict(stats.response_stats)
        (index,) = cancels
        assert stats.response_stats["0"].success.count == 1 and int(index) >= 1
    finally:
        client.close()


def test_a_completed_stream_is_one_success_with_response_stats_per_index(server):
    client = grpcclient.InferenceServerClient(server.url)
    got: list = []
    done = threading.Event()

    def callback(result, error) -> None:  # type: ignore[no-untyped-def]
        got.append((result, error))
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([5], dtype=np.int32))
    try:
        before = client.get_inference_statistics("three").model_stats[0]
        client.start_stream(callback=callback)
        client.async_stream_infer("three", inputs, enable_empty_final_response=True)
        assert done.wait(WAIT)
        client.stop_stream()
        assert [e for _, e in got] == [None] * 4
        values = [r.as_numpy("OUT")[0] for r, _ in got[:3]]
        assert values == [5, 6, 7]
        after = client.get_inference_statistics("three").model_stats[0]
        assert after.inference_stats.success.count == before.inference_stats.success.count + 1
        assert after.inference_stats.fail.count == before.inference_stats.fail.count == 0
        stats = after.response_stats
        assert sorted(stats) == ["0", "1", "2", "3"]
        for i in "012":
            assert stats[i].success.count == 1 and stats[i].compute_infer.count == 1
            assert stats[i].compute_output.count == 1 and stats[i].fail.count == 0
        assert stats["3"].empty_response.count == 1 and stats["3"].success.count == 0
        # The same figures over HTTP.
        doc = requests.get(f"http://{server.http_url}/v2/models/three/stats", timeout=WAIT).json()
        (model,) = doc["model_stats"]
        assert sorted(model["response_stats"]) == ["0", "1", "2", "3"]
        assert model["response_stats"]["3"]["empty_response"]["count"] == 1
        assert model["response_stats"]["1"]["success"]["count"] == 1
        # A model that is not decoupled answers each request with its one response, index 0.
        plain_in = [grpcclient.InferInput("IN", [1], "INT32")]
        plain_in[0].set_data_from_numpy(np.array([2], dtype=np.int32))
        assert client.infer("plain", plain_in).as_numpy("OUT")[0] == 2
        plain = client.get_inference_statistics("plain").model_stats[0]
        assert list(plain.response_stats) == ["0"]
        assert plain.response_stats["0"].success.count == plain.inference_stats.success.count == 1
        assert plain.response_stats["0"].compute_infer.count == 1
    finally:
        client.close()


def test_sigterm_ends_the_process_tree_while_a_model_is_held_by_its_client(repo, tmp_path):
    _reset(repo, "flood")
    with running(repo, extra_args=["--stream-max-responses", str(STREAM_LIMIT), "--exit-timeout-secs", "2"],
                 exit_zero=False) as server:
        stream = SlowStream(server.url, _request("flood", FLOOD_COUNT))
        try:
            assert not stream.read().error_message
            assert _wait_for(lambda: _progress(repo, "flood") > 0)
            code = server.stop()  # SIGTERM; the fixture checks nothing of the group is left
        finally:
            stream.cancel()
        # It ended by itself (a graceful stop, or its watchdog), not by the test's kill after 30 s.
        assert code in (0, 1), (code, server.log())


def test_an_http_generate_stream_client_that_leaves_cancels_the_model(server, repo):
    import http.client

    _reset(repo, "flood")
    conn = http.client.HTTPConnection(*server.http_url.split(":"), timeout=WAIT)
    try:
        conn.request("POST", "/v2/models/flood/generate_stream", body=f'{{"IN": [{FLOOD_COUNT}]}}',
                     headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 200
        assert answer.read(6) == b"data: "  # the first event has begun
    finally:
        conn.sock.shutdown(2)  # the client leaves without reading the rest
        conn.close()
    assert _wait_for(lambda: any((repo / "flood").glob("cancelled.*"))), "the model never saw is_cancelled()"
    sent = int(next((repo / "flood").glob("cancelled.*")).name.split(".")[1])
    assert sent < FLOOD_COUNT


def _steps(repo: Path, sequence_id: int) -> int:
    try:
        return int((repo / "iter_flood" / f"steps.{sequence_id}").read_text() or 0)
    except FileNotFoundError:
        return 0


def _metric(server, family: str, model: str) -> float:  # type: ignore[no-untyped-def]
    """One model's value of ``family`` in one scrape of the server's /metrics."""
    value = server.metric(family, f'{{model="{model}",version="1"}}')
    assert value is not None, f"/metrics has no {family} for model '{model}'"
    return value


def _value(response: pb.ModelStreamInferResponse) -> float:
    assert not response.error_message, response.error_message
    return float(np.frombuffer(response.infer_response.raw_output_contents[0], np.float32)[0])


def test_an_iterative_stream_whose_client_reads_slowly_is_paused_while_its_batch_goes_on(server, repo):
    slow = SlowStream(server.url, _request("iter_flood", ITER_STEPS, sequence_id=101))
    fast = SlowStream(server.url, _request("iter_flood", ITER_STEPS, sequence_id=102))
    try:
        assert _value(slow.read()) == 0  # the slow stream's sequence is running; its client now reads nothing
        # The other sequence, on the same instance, runs all its steps meanwhile, its client reading each.
        assert [_value(fast.read()) for _ in range(ITER_STEPS)] == list(range(ITER_STEPS))
        # The slow one was held back: paused after what the server's bounds and its client's 64 KiB
        # window hold (the sink (4), the stream's write window (64), the hand-off's credit (64), a few in
        # transit), not stepped on to fail RESOURCE_EXHAUSTED or to fill the server.
        bound = STREAM_LIMIT + 2 * 64 + 100
        held = _steps(repo, 101)
        assert 0 < held < bound, f"the model stepped {held} times for a client that read one response"
        assert _steps(repo, 102) == ITER_STEPS
        # /metrics shows it: the slow sequence is paused now (its client still reads nothing), and was paused
        # at least once.
        assert _metric(server, "inferd_stream_paused_sequences", "iter_flood") == 1
        assert _metric(server, "inferd_stream_pauses_total", "iter_flood") >= 1
        # Read at last, it resumes and gets every response, in order, none refused.
        assert [_value(slow.read()) for _ in range(1, ITER_STEPS)] == list(range(1, ITER_STEPS))
        assert _steps(repo, 101) == ITER_STEPS
    finally:
        slow.cancel()
        fast.cancel()
    assert _metric(server, "inferd_stream_paused_sequences", "iter_flood") == 0  # both streams ended
    client = grpcclient.InferenceServerClient(server.url)
    try:
        stats = client.get_inference_statistics("iter_flood").model_stats[0]
        assert stats.inference_stats.success.count == 2 and stats.inference_stats.fail.count == 0
    finally:
        client.close()
