"""Issue #2: graceful stop. SIGTERM while a request is in flight lets it finish, new
requests are refused meanwhile, and the server exits 0."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from inferd.examples import onnx_models as om
from repo_builder import add_model, config

SIZE = 256


def _slow_model():
    """Y = X + N, in N Loop iterations that each also do a [256, 256] MatMul (times zero):
    the caller sets how long a request takes."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((SIZE, SIZE)) / np.sqrt(SIZE)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["v_in", "W"], ["mm"]),
            helper.make_node("Tanh", ["mm"], ["t"]),
            helper.make_node("ReduceMean", ["t"], ["m"], keepdims=0),
            helper.make_node("Mul", ["m", "zero"], ["z"]),
            helper.make_node("Add", ["v_in", "one"], ["v1"]),
            helper.make_node("Add", ["v1", "z"], ["v_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [SIZE, SIZE])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [SIZE, SIZE])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["N", "", "X"], ["Y"], body=body)],
        "slow",
        [helper.make_tensor_value_info("N", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("X", TensorProto.FLOAT, [SIZE, SIZE])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [SIZE, SIZE])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0, np.float32), "zero"),
                     numpy_helper.from_array(np.array(1, np.float32), "one")],
    )
    return om._model(graph)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("lifecycle")
    add_model(repo, "slow", _slow_model(), config(
        "slow", [("N", "TYPE_INT64", [1]), ("X", "TYPE_FP32", [SIZE, SIZE])], [("Y", "TYPE_FP32", [SIZE, SIZE])], 0))
    return repo


def _inputs(n: int) -> list[grpcclient.InferInput]:
    count = grpcclient.InferInput("N", [1], "INT64")
    count.set_data_from_numpy(np.array([n], dtype=np.int64))
    x = grpcclient.InferInput("X", [SIZE, SIZE], "FP32")
    x.set_data_from_numpy(np.zeros((SIZE, SIZE), dtype=np.float32))
    return [count, x]


def _iterations_for(client, seconds: float) -> int:
    """Loop iterations that take about ``seconds`` on this machine now (relative, measured)."""
    probe = 200
    start = time.monotonic()
    client.infer("slow", _inputs(probe))
    elapsed = max(time.monotonic() - start, 1e-3)
    return int(min(max(probe * seconds / elapsed, probe * 4), 1_000_000))


class _InFlight(threading.Thread):
    def __init__(self, url: str, n: int) -> None:
        super().__init__(daemon=True)
        self.url, self.n = url, n
        self.result = None
        self.error: BaseException | None = None
        self.done_at = 0.0

    def run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            self.result = client.infer("slow", _inputs(self.n), client_timeout=120)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.done_at = time.monotonic()
            client.close()


def _wait_refused(client, timeout: float = 30) -> None:
    """Until the server stops answering as ready (the stop began)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not client.is_server_ready():
                return
        except InferenceServerException:
            return
        time.sleep(0.01)
    raise AssertionError("the server kept answering ready after SIGTERM")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_lets_in_flight_request_finish(start_server, repo, tmp_path, sig):
    server = start_server(repo, log_path=tmp_path / "server.log")
    client = grpcclient.InferenceServerClient(server.url)
    n = _iterations_for(client, 1.5)

    request = _InFlight(server.url, n)
    request.start()
    time.sleep(0.2)  # let it reach the model
    assert request.is_alive(), "the slow request finished before the signal; the test proves nothing"
    signal_at = time.monotonic()
    server.proc.send_signal(sig)

    _wait_refused(client)
    client.close()
    # The stop has begun: new requests are refused...
    late = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as exc:
        late.infer("slow", _inputs(1), client_timeout=10)
    assert exc.value.status() == "StatusCode.UNAVAILABLE"
    late.close()

    # ...while the one in flight finishes, with the right answer.
    request.join(60)
    assert request.error is None, f"{request.error}\n{server.log()}"
    assert request.done_at > signal_at
    np.testing.assert_array_equal(request.result.as_numpy("Y"), np.full((SIZE, SIZE), n, dtype=np.float32))

    assert server.proc.wait(60) == 0, server.log()
    log = server.log()
    assert "stopping: finishing in-flight requests" in log and "stopped" in log
    assert "Traceback" not in log


def test_idle_server_exits_zero(start_server, repo, tmp_path):
    server = start_server(repo, log_path=tmp_path / "server.log")
    client = grpcclient.InferenceServerClient(server.url)
    assert client.is_server_ready()
    client.close()
    assert server.stop(signal.SIGTERM) == 0, server.log()


def test_grace_period_bounds_the_wait(start_server, repo, tmp_path):
    """A request longer than --exit-timeout-secs is cut off; the server still exits 0."""
    server = start_server(repo, ["--exit-timeout-secs", "0.2"], log_path=tmp_path / "server.log")
    client = grpcclient.InferenceServerClient(server.url)
    n = _iterations_for(client, 2.0)
    client.close()
    request = _InFlight(server.url, n)
    request.start()
    time.sleep(0.2)
    assert request.is_alive()
    server.proc.send_signal(signal.SIGTERM)
    request.join(60)
    assert isinstance(request.error, InferenceServerException), request.result
    assert request.error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED")
    assert server.proc.wait(60) == 0, server.log()
