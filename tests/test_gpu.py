"""The GPU paths on a real GPU (pytest -m gpu; every test here is skipped on a host without
CUDA, and bench/gpu_check.sh runs them on the GPU machine): KIND_GPU placement, TorchScript on
cuda:0 against the same model on the CPU, pinned staging and streams, CUDA shared memory
through tritonclient's own utilities, an ensemble of GPU steps, NVML metrics."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda)")]

from conftest import running  # noqa: E402
from inferd.examples import torch_models as tm  # noqa: E402
from inferd.examples.build import ensemble_steps, triton_config  # noqa: E402

PT = "pytorch_libtorch"
IMAGE = 16


def _model(repo: Path, name: str, data: bytes, text: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.pt").write_bytes(data)
    (repo / name / "config.pbtxt").write_text(text)


def _net_config(name: str, group: str, batching: bool = True) -> str:
    io = ([("INPUT__0", "TYPE_FP32", [3, IMAGE, IMAGE])], [("OUTPUT__0", "TYPE_FP32", [10])])
    return triton_config(name, *io, max_batch_size=16, platform=PT, dynamic_batching="" if batching else None,
                         instance_count=0, extra=f"instance_group [ {group} ]")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_repo")
    net = tm.resnet(8)
    _model(repo, "net_cpu", net, _net_config("net_cpu", "{ kind: KIND_CPU count: 1 }"))
    _model(repo, "net_gpu", net, _net_config("net_gpu", "{ kind: KIND_GPU count: 2 }"))
    _model(repo, "net_auto", net, _net_config("net_auto", "{ kind: KIND_AUTO count: 1 }"))
    _model(repo, "net_missing_gpu", net, _net_config("net_missing_gpu", "{ name: \"far\" kind: KIND_GPU gpus: [ 97 ] }"))
    add_sub = tm.add_sub()
    io = ([("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_FP32", [4])],
          [("OUTPUT__0", "TYPE_FP32", [4]), ("OUTPUT__1", "TYPE_FP32", [4])])
    _model(repo, "add_sub_gpu", add_sub, triton_config("add_sub_gpu", *io, max_batch_size=8, platform=PT,
                                                       instance_count=1, instance_kind="KIND_GPU"))
    # Two GPU steps: (a+b, a-b) then ((a+b)+(a-b), (a+b)-(a-b)) = (2a, 2b); the middle stays on cuda:0.
    steps = ensemble_steps([
        ("add_sub_gpu", {"INPUT__0": "A", "INPUT__1": "B"}, {"OUTPUT__0": "sum", "OUTPUT__1": "diff"}),
        ("add_sub_gpu", {"INPUT__0": "sum", "INPUT__1": "diff"}, {"OUTPUT__0": "TWICE_A", "OUTPUT__1": "TWICE_B"}),
    ])
    (repo / "twice" / "1").mkdir(parents=True)
    (repo / "twice" / "config.pbtxt").write_text(triton_config(
        "twice", [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [4])],
        [("TWICE_A", "TYPE_FP32", [4]), ("TWICE_B", "TYPE_FP32", [4])], max_batch_size=8, platform="ensemble",
        instance_count=0, extra=steps))
    with running(repo, extra_args=["--allow-client-shm"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, IMAGE, IMAGE)).astype(np.float32)


def _infer(client, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUTPUT__0")


def test_kind_gpu_without_gpus_places_instances_on_every_visible_gpu(client):
    config = client.get_model_config("net_gpu", as_json=True)["config"]
    group = config["instance_group"][0]
    assert group["kind"] == "KIND_GPU"
    assert [int(g) for g in group["gpus"]] == list(range(torch.cuda.device_count()))
    auto = client.get_model_config("net_auto", as_json=True)["config"]["instance_group"][0]
    assert auto["kind"] == "KIND_GPU"  # KIND_AUTO on a GPU host


def test_a_gpu_that_does_not_exist_is_refused_at_load_naming_it(client):
    index = {m.name: m for m in client.get_model_repository_index().models}
    reason = index["net_missing_gpu"].reason
    assert index["net_missing_gpu"].state == "UNAVAILABLE"
    assert "net_missing_gpu" in reason and "'far'" in reason and "GPU 97" in reason and "visible GPUs are 0" in reason


def test_torchscript_on_cuda_matches_the_cpu(client):
    x = _images(3)
    # TF32 convolutions on the GPU (torch's default) against FP32 on the CPU: close, not equal.
    np.testing.assert_allclose(_infer(client, "net_gpu", x), _infer(client, "net_cpu", x), rtol=1e-2, atol=1e-2)


def test_concurrent_requests_batch_on_the_gpu_and_each_gets_its_rows(client):
    xs = [_images(1 + i % 3, seed=i) for i in range(24)]
    expected = [_infer(client, "net_cpu", x) for x in xs]
    got: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        got[i] = _infer(client, "net_gpu", xs[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(expected):
        np.testing.assert_allclose(got[i], want, rtol=1e-2, atol=1e-2)
    stats = client.get_inference_statistics("net_gpu").model_stats[0]
    assert stats.inference_count >= sum(len(x) for x in xs)


def test_an_ensemble_of_gpu_steps_is_right(client):
    import tritonclient.grpc as grpcclient

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = -np.ones((2, 4), np.float32)
    inputs = []
    for name, v in (("A", a), ("B", b)):
        inp = grpcclient.InferInput(name, list(v.shape), "FP32")
        inp.set_data_from_numpy(v)
        inputs.append(inp)
    r = client.infer("twice", inputs)
    np.testing.assert_array_equal(r.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(r.as_numpy("TWICE_B"), 2 * b)


def test_cuda_shared_memory_round_trip_is_identical_to_the_host_path(client):
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    x = _images(2, seed=7)
    out_bytes = 2 * 10 * 4
    region_in = cudashm.create_shared_memory_region("t_in", x.nbytes, 0)
    region_out = cudashm.create_shared_memory_region("t_out", out_bytes, 0)
    try:
        cudashm.set_shared_memory_region(region_in, [x])
        client.register_cuda_shared_memory("t_in", cudashm.get_raw_handle(region_in), 0, x.nbytes)
        client.register_cuda_shared_memory("t_out", cudashm.get_raw_handle(region_out), 0, out_bytes)
        status = client.get_cuda_shared_memory_status(as_json=True)
        assert set(status["regions"]) == {"t_in", "t_out"}  # a map by name, as Triton's
        assert int(status["regions"]["t_in"]["byte_size"]) == x.nbytes
        inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_shared_memory("t_in", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT__0")
        out.set_shared_memory("t_out", out_bytes)
        client.infer("net_gpu", [inp], outputs=[out])
        via_shm = cudashm.get_contents_as_numpy(region_out, np.float32, [2, 10])
        np.testing.assert_array_equal(via_shm, _infer(client, "net_gpu", x))
        # a CPU model reads the same device memory (one copy to the host)
        client.infer("net_cpu", [inp], outputs=[out])
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(region_out, np.float32, [2, 10]),
                                      _infer(client, "net_cpu", x))
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(region_in)
        cudashm.destroy_shared_memory_region(region_out)
    assert not client.get_cuda_shared_memory_status(as_json=True).get("regions")


def test_cuda_shared_memory_refuses_bad_registrations_naming_the_region(client):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("bad", b"\0" * 64, 97, 64)
    assert "'bad'" in info.value.message() and "device_id 97" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("bad", b"\1" * 64, 0, 64)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "'bad'" in info.value.message()


def test_nvml_metrics_name_each_gpu_by_its_uuid(server):
    from prometheus_client.parser import text_string_to_metric_families

    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    uuids = [u.decode() if isinstance(u, bytes) else u for u in uuids]
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    found = {(s.name, s.labels.get("gpu_uuid")) for f in text_string_to_metric_families(text) for s in f.samples}
    for family in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage"):
        assert any((family, u) in found for u in uuids), (family, uuids, sorted(x for x in found if x[1])[:12])
    # the inventory names the GPUs as NVML does, so only the server's visible GPUs are reported
    from inferd.gpu.inventory import TorchGpuInventory

    assert {g.uuid for g in TorchGpuInventory().gpus()} <= set(uuids)


def test_the_stager_assembles_in_pinned_memory_and_runs_on_its_own_stream():
    from inferd.backends.torch_device import TorchStager
    from inferd.gpu.tensor import DeviceTensor

    device = torch.device("cuda", 0)
    a, b = TorchStager(torch, device), TorchStager(torch, device)
    assert a.stream is not None and a.stream != b.stream
    parts = [np.full((n, 2), n, np.float32) for n in (1, 2)]
    assert a._assemble(parts, np.dtype(np.float32)).is_pinned()
    with a.running():
        assert torch.cuda.current_stream(device) == a.stream
        t = a.batch_input(parts, np.dtype(np.float32))
        out = a.outputs({"Y": t * 2})
        kept = a.outputs({"Y": t * 3}, keep_on_device=True)
    assert t.device == device and out["Y"].tolist() == [[2, 2], [4, 4], [4, 4]]
    assert isinstance(kept["Y"], DeviceTensor) and kept["Y"].device == "cuda:0"
    with b.running():
        joined = b.batch_input([kept["Y"], parts[0]], np.dtype(np.float32))
    assert joined.device == device and joined[:, 0].tolist() == [3, 6, 6, 1]


def test_the_inventory_sees_the_gpus_torch_sees():
    from inferd.gpu.inventory import TorchGpuInventory

    gpus = TorchGpuInventory().gpus()
    assert [g.index for g in gpus] == list(range(torch.cuda.device_count()))
    assert all(g.uuid.startswith("GPU-") and g.total_memory > 0 and g.capability >= (6, 0) for g in gpus)
