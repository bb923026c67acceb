"""Instance placement from instance_group, as Triton settles it, on a made-up host of
several GPUs (FakeGpuInventory): no CUDA needed. The pure decisions (settle_groups,
placements), then the whole config pipeline through a ModelManager given the fake host,
and the onnxruntime CUDA path with a fake provider list (onnxruntime-gpu cannot be
installed where the GPU check runs, so this is where that path is tested)."""

from __future__ import annotations

import numpy as np
import pytest

from inferd import backends
from inferd.config import InstanceGroup, placements, settle_groups
from inferd.errors import ConfigError
from inferd.gpu.inventory import FakeGpuInventory

FOUR = tuple(g.index for g in FakeGpuInventory(4).gpus())


def settle(*groups: InstanceGroup, visible=FOUR, backend_gpu=True, backend="pytorch"):
    return settle_groups("m", groups, visible, backend=backends.get(backend), backend_gpu=backend_gpu)


def devices(groups) -> list[str]:
    return ["cpu" if gpu is None else f"cuda:{gpu}" for _, gpu in placements(groups)]


def test_kind_gpu_without_gpus_puts_count_instances_on_every_visible_gpu():
    got = settle(InstanceGroup("g", "KIND_GPU", 2))
    assert got == (InstanceGroup("g", "KIND_GPU", 2, (0, 1, 2, 3)),)  # what the served config shows
    assert devices(got) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"] * 2  # one on each, then the second on each
    assert [name for name, _ in placements(got)] == [f"g_{k}" for k in range(8)]


def test_gpus_select_and_keep_their_order():
    assert devices(settle(InstanceGroup("g", "KIND_GPU", 1, (3, 1)))) == ["cuda:3", "cuda:1"]
    assert devices(settle(InstanceGroup("g", "KIND_GPU", 2, (2,)))) == ["cuda:2", "cuda:2"]


def test_a_gpu_listed_twice_gets_its_instances_twice_as_in_triton():
    assert devices(settle(InstanceGroup("g", "KIND_GPU", 1, (0, 0)))) == ["cuda:0", "cuda:0"]


def test_a_gpu_that_does_not_exist_is_refused_naming_model_group_index_and_visible_ones():
    with pytest.raises(ConfigError) as info:
        settle(InstanceGroup("fast", "KIND_GPU", 1, (1, 7)), visible=(0, 1, 2))
    message = str(info.value)
    assert "model 'm'" in message and "instance_group[0] 'fast'" in message
    assert "GPU 7" in message and "visible GPUs are 0, 1, 2" in message


def test_a_missing_gpu_in_a_later_group_names_that_group():
    with pytest.raises(ConfigError, match=r"instance_group\[1\] 'm_1' asks for GPU 4"):
        settle(InstanceGroup("", "KIND_GPU", 1, (0,)), InstanceGroup("", "KIND_GPU", 1, (4,)))


def test_kind_gpu_on_a_host_without_gpus_is_refused():
    with pytest.raises(ConfigError, match="KIND_GPU but no GPUs are available"):
        settle(InstanceGroup("g", "KIND_GPU", 1), visible=())


def test_kind_gpu_with_a_backend_that_cannot_use_the_gpus_is_refused_saying_why():
    with pytest.raises(ConfigError) as info:
        settle(InstanceGroup("g", "KIND_GPU", 1), backend="onnxruntime", backend_gpu=False)
    assert "onnxruntime" in str(info.value) and "CUDAExecutionProvider" in str(info.value)


def test_kind_auto_is_gpu_on_a_gpu_host_and_cpu_elsewhere():
    assert settle(InstanceGroup("a", "KIND_AUTO", 1)) == (InstanceGroup("a", "KIND_GPU", 1, FOUR),)
    assert devices(settle(InstanceGroup("a", "KIND_AUTO", 2), visible=())) == ["cpu", "cpu"]
    assert devices(settle(InstanceGroup("a", "KIND_AUTO", 1), backend_gpu=False)) == ["cpu"]


def test_kind_auto_listing_gpus_places_on_them_and_refuses_one_that_is_not_there():
    assert devices(settle(InstanceGroup("a", "KIND_AUTO", 1, (1, 2)))) == ["cuda:1", "cuda:2"]
    with pytest.raises(ConfigError, match="asks for GPU 9"):
        settle(InstanceGroup("a", "KIND_AUTO", 1, (1, 9)))
    with pytest.raises(ConfigError, match="asks for GPU 0, .* the visible GPUs are none"):
        settle(InstanceGroup("a", "KIND_AUTO", 1, (0,)), visible=())


def test_no_group_is_one_auto_group_and_count_zero_is_one():
    got = settle()
    assert got == (InstanceGroup("m_0", "KIND_GPU", 1, FOUR),)
    assert [name for name, _ in placements(got)] == ["m_0_0", "m_0_1", "m_0_2", "m_0_3"]
    assert placements(settle(visible=())) == [("m_0_0", None)]
    assert settle(InstanceGroup("c", "KIND_CPU", 0)) == (InstanceGroup("c", "KIND_CPU", 1),)


def test_cpu_groups_stay_on_the_cpu_beside_gpu_groups():
    got = settle(InstanceGroup("c", "KIND_CPU", 2), InstanceGroup("g", "KIND_GPU", 1, (2,)))
    assert placements(got) == [("c_0", None), ("c_1", None), ("g_0", 2)]


# -- through the config pipeline and the loader ---------------------------------------------


def _torch_model(repo, name: str, group: str) -> None:
    from inferd.examples import torch_models as tm
    from inferd.examples.build import triton_config

    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.pt").write_bytes(tm.add_sub())
    io = ([("INPUT__0", "TYPE_FP32", [2]), ("INPUT__1", "TYPE_FP32", [2])],
          [("OUTPUT__0", "TYPE_FP32", [2]), ("OUTPUT__1", "TYPE_FP32", [2])])
    (repo / name / "config.pbtxt").write_text(triton_config(name, *io, max_batch_size=4, platform="pytorch_libtorch",
                                                            instance_count=0, extra=f"instance_group [ {group} ]"))


def _onnx_model(repo, name: str, group: str) -> None:
    from inferd.examples import onnx_models as om
    from repo_builder import add_model, config

    add_model(repo, name, om.identity(np.float32, [2], batch=True),
              config(name, [("INPUT0", "TYPE_FP32", [2])], [("OUTPUT0", "TYPE_FP32", [2])], 4,
                     extra=f"instance_group [ {group} ]\n"))


async def _load(repo, inventory):
    from inferd.repository.manager import ModelManager

    manager = ModelManager([repo], gpus=inventory)
    await manager.load_all()
    return manager


async def test_a_host_without_gpus_serves_kind_auto_on_the_cpu_and_refuses_kind_gpu(tmp_path):
    from inferd.config import message_to_dict

    _torch_model(tmp_path, "auto", "{ kind: KIND_AUTO count: 2 }")
    _torch_model(tmp_path, "gpu", "{ name: \"g\" kind: KIND_GPU }")
    manager = await _load(tmp_path, FakeGpuInventory(0))
    try:
        index = {e.name: e for e in manager.index()}
        assert index["auto"].state == "READY"
        group = message_to_dict(manager.get("auto").spec.config)["instance_group"][0]
        assert group["kind"] == "KIND_CPU" and group["count"] == 2 and group["name"] == "auto_0"
        assert index["gpu"].state == "UNAVAILABLE"
        assert "model 'gpu': instance_group[0] 'g' has kind KIND_GPU but no GPUs are available" in index["gpu"].reason
    finally:
        await manager.stop()


async def test_a_missing_gpu_on_a_host_of_two_is_refused_at_load(tmp_path):
    _torch_model(tmp_path, "far", "{ kind: KIND_GPU gpus: [ 5 ] }")
    _onnx_model(tmp_path, "ort_far", "{ kind: KIND_GPU gpus: [ 0, 3 ] }")
    manager = await _load(tmp_path, FakeGpuInventory(2))
    try:
        index = {e.name: e for e in manager.index()}
        assert "'far_0' asks for GPU 5" in index["far"].reason and "visible GPUs are 0, 1" in index["far"].reason
        assert "'ort_far_0' asks for GPU 3" in index["ort_far"].reason
    finally:
        await manager.stop()


async def test_onnxruntime_kind_gpu_gets_the_cuda_provider_of_each_gpu_given_a_fake_provider_list(tmp_path, monkeypatch):
    """onnxruntime (CPU build) reporting the CUDA provider: each instance's session asks for
    CUDAExecutionProvider on its own GPU, with the CPU provider behind it; ORT then runs on the
    CPU provider, so the model still answers."""
    import onnxruntime as ort

    real_session = ort.InferenceSession
    asked: list[list] = []

    def session(path, sess_options=None, providers=None, **kw):  # type: ignore[no-untyped-def]
        asked.append(list(providers or []))
        return real_session(path, sess_options=sess_options, providers=["CPUExecutionProvider"], **kw)

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", session)
    _onnx_model(tmp_path, "ort_gpu", "{ kind: KIND_GPU count: 1 }")
    manager = await _load(tmp_path, FakeGpuInventory(2))
    try:
        assert {e.name: e.state for e in manager.index()}["ort_gpu"] == "READY"
        cuda = [p for p in asked if p and p[0] != "CPUExecutionProvider"]
        assert cuda == [[("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"],
                        [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]]
        from inferd.types import InferenceRequest

        model = manager.get("ort_gpu")
        x = np.ones((1, 2), np.float32)
        out = await model.scheduler.infer(InferenceRequest("ort_gpu", {"INPUT0": x}), 1)
        np.testing.assert_array_equal(out["OUTPUT0"], x)
    finally:
        await manager.stop()
