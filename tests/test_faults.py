"""Issue 16, item 2: faults in models, against a real server.

- an execution past ``inferd.execution_timeout_microseconds`` fails with DEADLINE_EXCEEDED naming the
  model, its instance is replaced (the next request is served), other models are unaffected, and past
  ``inferd.max_retired_instances`` stuck executions the model is reported unavailable until they return;
- a model that raises fails only its own batch;
- a Python model that leaks memory shows it in ``inferd_model_memory_growth_bytes``;
- a model file corrupted on disk during a reload: the previous version keeps serving, the reason is reported;
- a server killed with SIGKILL and started again on the same ports serves, with no manual step.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from repo_builder import add_model, config

HANG = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] < 0:
                time.sleep(float(-x[0]))  # "hangs" for that many seconds
            if x[0] == 13:
                raise RuntimeError("thirteen is unlucky")
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''
LEAKY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        KEPT.append(np.ones(1 << 20, dtype=np.uint8))  # 1 MiB kept for good on every execution
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''
PY = 'backend: "python"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n'
TIMEOUT = ('parameters { key: "inferd.execution_timeout_microseconds" value { string_value: "300000" } }\n'
           'parameters { key: "inferd.max_retired_instances" value { string_value: "1" } }\n')
INLINE = 'parameters { key: "inferd.host" value { string_value: "inline" } }\n'



def _python_model(repo: Path, name: str, source: str, extra: str = "") -> None:
    add_model(repo, name, source.encode(), config(
        name, [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0, platform=None,
        extra=PY + extra), filename="model.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from conftest import running
    from inferd.examples import onnx_models as om

    repo = tmp_path_factory.mktemp("faults")
    _python_model(repo, "hang", HANG, TIMEOUT)
    # Retiring stuck threads is how an instance in the core's process is replaced (a hosted one's host is
    # killed instead: test_an_execution_past_its_timeout_fails_and_its_instance_is_replaced, hang).
    _python_model(repo, "hang2", HANG, TIMEOUT + INLINE)
    _python_model(repo, "raiser", HANG)
    _python_model(repo, "leaky", LEAKY)
    add_model(repo, "other", om.identity(np.float32, [-1], batch=False), config(
        "other", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    with running(repo, no_traceback=False) as s:  # the raiser's traceback is logged, as it should be
        yield s


def _infer(client, model: str, values: list[float], timeout: float | None = 60):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    x.set_data_from_numpy(np.array(values, dtype=np.float32))
    return client.infer(model, [x], client_timeout=timeout)


def _metric(server, name: str, labels: str) -> float | None:  # type: ignore[no-untyped-def]
    return server.metric(name, labels)


def test_an_execution_past_its_timeout_fails_and_its_instance_is_replaced(server, client) -> None:  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    with ThreadPoolExecutor(2) as pool:
        stuck = pool.submit(_infer, client, "hang", [-3.0])  # sleeps 3 s; the limit is 0.3 s
        # Another model answers while the hang's thread is stuck.
        assert _infer(client, "other", [1.0]).as_numpy("OUTPUT0").tolist() == [1.0]
        with pytest.raises(InferenceServerException) as info:
            stuck.result(timeout=60)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    message = info.value.message()
    assert "model 'hang'" in message and "inferd.execution_timeout_microseconds (300000 us)" in message
    # A new instance serves the next request, while the retired one is still asleep.
    assert _infer(client, "hang", [2.0]).as_numpy("OUTPUT0").tolist() == [2.0]
    assert _metric(server, "inferd_inference_request_failure_total", '{model="hang",reason="TIMEOUT",version="1"}') == 1


def test_past_max_retired_the_model_is_unavailable_until_a_stuck_one_returns(server, client) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    for _ in range(2):  # two stuck at once: more than inferd.max_retired_instances (1)
        with pytest.raises(InferenceServerException, match="execution_timeout_microseconds"):
            _infer(client, "hang2", [-4.0])
    assert not client.is_model_ready("hang2")
    entry = next(m for m in client.get_model_repository_index().models if m.name == "hang2")
    assert entry.state == "UNAVAILABLE" and "stuck past inferd.execution_timeout_microseconds" in entry.reason
    with pytest.raises(InferenceServerException) as info:
        _infer(client, "hang2", [1.0])
    assert info.value.status() == "StatusCode.UNAVAILABLE" and "inferd.max_retired_instances" in info.value.message()
    assert client.is_model_ready("other")
    deadline = time.monotonic() + 30
    while not client.is_model_ready("hang2") and time.monotonic() < deadline:  # once a 4 s sleep ends
        time.sleep(0.1)
    assert client.is_model_ready("hang2")
    assert _infer(client, "hang2", [5.0]).as_numpy("OUTPUT0").tolist() == [5.0]


def test_a_model_that_raises_fails_only_its_own_batch(client) -> None:  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_infer, client, "raiser", [13.0 if i == 2 else float(i)]) for i in range(6)]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(timeout=60).as_numpy("OUTPUT0").tolist())
            except InferenceServerException as exc:
                outcomes.append((exc.status(), exc.message()))
    assert outcomes[2][0] == "StatusCode.INTERNAL"
    assert "model 'raiser'" in outcomes[2][1] and "thirteen is unlucky" in outcomes[2][1]
    assert [o for i, o in enumerate(outcomes) if i != 2] == [[0.0], [1.0], [3.0], [4.0], [5.0]]


def test_a_leaking_python_model_shows_in_its_memory_metric(server, client) -> None:  # type: ignore[no-untyped-def]
    for i in range(24):
        _infer(client, "leaky", [float(i)])
        _infer(client, "raiser", [float(i + 20)])
    leaked = _metric(server, "inferd_model_memory_growth_bytes", '{model="leaky",version="1"}')
    steady = _metric(server, "inferd_model_memory_growth_bytes", '{model="raiser",version="1"}')
    assert leaked is not None and leaked >= 16 * 2**20, leaked  # 24 MiB kept
    assert steady is not None and abs(steady) < leaked / 4, (steady, leaked)
    # Where the backend cannot measure it (ONNX Runtime's own allocator), there is no series.
    assert _metric(server, "inferd_model_memory_growth_bytes", '{model="other",version="1"}') is None


# -- reloads and restarts ------------------------------------------------------------------------------------


def test_a_model_file_corrupted_during_a_reload_leaves_the_previous_version_serving(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from inferd.examples import onnx_models as om

    model_dir = add_model(tmp_path, "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    server = start_server(tmp_path, ["--model-control-mode", "explicit", "--load-model", "m"])
    client = grpcclient.InferenceServerClient(server.url)
    assert _infer(client, "m", [1.0]).as_numpy("OUTPUT0").tolist() == [1.0]
    data = (model_dir / "1" / "model.onnx").read_bytes()
    (model_dir / "1" / "model.onnx").write_bytes(data[: len(data) // 2] + b"\x00garbage" * 64)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("m")
    assert "failed to load 'm'" in info.value.message()
    assert _infer(client, "m", [2.0]).as_numpy("OUTPUT0").tolist() == [2.0]  # the old version serves
    entry = next(e for e in client.get_model_repository_index().models if e.name == "m")
    assert entry.state == "READY" and entry.reason.startswith("reload failed, serving the previous version")
    assert "model.onnx" in entry.reason or "protobuf" in entry.reason.lower() or "load" in entry.reason.lower()
    (model_dir / "1" / "model.onnx").write_bytes(data)  # fixed: the next reload takes it
    client.load_model("m")
    entry = next(e for e in client.get_model_repository_index().models if e.name == "m")
    assert entry.state == "READY" and entry.reason == ""
    client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigkill_then_restart_on_the_same_ports_serves_with_no_manual_step(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    from conftest import ServerProcess
    from inferd.examples import onnx_models as om

    add_model(tmp_path / "repo", "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    ports = ["--grpc-port", str(_free_port()), "--http-port", str(_free_port()), "--metrics-port", str(_free_port())]
    region = shm.create_shared_memory_region("fault_region", "/inferd_fault_region", 64)
    try:
        for run in range(2):
            # The fixture's own "--grpc-port 0" comes first; the fixed ports given here win.
            server = ServerProcess(tmp_path / "repo", [*ports, "--allow-client-shm"], log_path=tmp_path / f"run{run}.log")
            try:
                client = grpcclient.InferenceServerClient(server.url)
                assert client.is_server_ready()
                client.register_system_shared_memory("fault_region", "/inferd_fault_region", 64)
                for i in range(20):  # connections and a region in use when the kill comes
                    assert _infer(client, "m", [float(i)]).as_numpy("OUTPUT0").tolist() == [float(i)]
                http = httpclient.InferenceServerClient(server.http_url)
                assert http.is_server_ready()
                if run == 0:
                    server.proc.send_signal(signal.SIGKILL)
                    server.proc.wait(30)
                http.close()
                client.close()
            finally:
                server.stop()
    finally:
        shm.destroy_shared_memory_region(region)
