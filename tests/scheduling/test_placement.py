"""Instance placement from instance_group, as Triton decides it, on a made-up host of
several GPUs (FakeGpuInventory): no CUDA needed."""

from __future__ import annotations

import pytest

from inferd.backends.base import Device
from inferd.errors import ConfigError
from inferd.gpu.inventory import FakeGpuInventory
from inferd.scheduling.placement import InstanceGroup, place_instances

FOUR = tuple(g.index for g in FakeGpuInventory(4).gpus())


def place(*groups: InstanceGroup, visible=FOUR, backend_gpu=True):
    return place_instances("m", groups, visible, backend="pytorch", backend_gpu=backend_gpu)


def devices(placements) -> list[str]:
    return [str(p.device) for p in placements]


def test_kind_gpu_without_gpus_puts_count_instances_on_every_visible_gpu():
    got = place(InstanceGroup("g", "KIND_GPU", 2))
    assert devices(got) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"] * 2  # one on each, then the second on each
    assert [p.name for p in got] == [f"g_{k}" for k in range(8)]
    assert {p.group for p in got} == {"g"}


def test_gpus_select_and_keep_their_order():
    got = place(InstanceGroup("g", "KIND_GPU", 1, (3, 1)))
    assert devices(got) == ["cuda:3", "cuda:1"]
    assert devices(place(InstanceGroup("g", "KIND_GPU", 2, (2,)))) == ["cuda:2", "cuda:2"]


def test_a_gpu_listed_twice_gets_its_instances_twice_as_in_triton():
    assert devices(place(InstanceGroup("g", "KIND_GPU", 1, (0, 0)))) == ["cuda:0", "cuda:0"]


def test_a_gpu_that_does_not_exist_is_refused_naming_model_group_index_and_visible_ones():
    with pytest.raises(ConfigError) as info:
        place(InstanceGroup("fast", "KIND_GPU", 1, (1, 7)), visible=(0, 1, 2))
    message = str(info.value)
    assert "model 'm'" in message and "instance_group[0] 'fast'" in message
    assert "GPU 7" in message and "visible GPUs are 0, 1, 2" in message


def test_a_missing_gpu_in_a_later_group_names_that_group():
    with pytest.raises(ConfigError, match=r"instance_group\[1\] 'm_1' asks for GPU 4"):
        place(InstanceGroup("", "KIND_GPU", 1, (0,)), InstanceGroup("", "KIND_GPU", 1, (4,)))


def test_kind_gpu_on_a_host_without_gpus_is_refused():
    with pytest.raises(ConfigError, match="KIND_GPU but no GPUs are available"):
        place(InstanceGroup("g", "KIND_GPU", 1), visible=())


def test_kind_gpu_with_a_backend_that_cannot_use_the_gpus_is_refused_saying_why():
    with pytest.raises(ConfigError) as info:
        place_instances("m", [InstanceGroup("g", "KIND_GPU", 1)], FOUR, backend="onnxruntime", backend_gpu=False)
    assert "onnxruntime" in str(info.value) and "CUDAExecutionProvider" in str(info.value)


def test_kind_auto_is_gpu_on_a_gpu_host_and_cpu_elsewhere():
    assert devices(place(InstanceGroup("a", "KIND_AUTO", 1))) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert devices(place(InstanceGroup("a", "KIND_AUTO", 2), visible=())) == ["cpu", "cpu"]
    assert devices(place(InstanceGroup("a", "KIND_AUTO", 1), backend_gpu=False)) == ["cpu"]


def test_kind_auto_listing_a_gpu_that_is_not_there_falls_back_to_cpu_as_in_triton():
    assert devices(place(InstanceGroup("a", "KIND_AUTO", 1, (1, 9)))) == ["cpu"]
    assert devices(place(InstanceGroup("a", "KIND_AUTO", 1, (1, 2)))) == ["cuda:1", "cuda:2"]


def test_no_group_is_one_auto_group_and_count_zero_is_one():
    got = place()
    assert [(p.name, str(p.device)) for p in got] == [("m_0_0", "cuda:0"), ("m_0_1", "cuda:1"),
                                                      ("m_0_2", "cuda:2"), ("m_0_3", "cuda:3")]
    assert devices(place(visible=())) == ["cpu"]
    assert [p.name for p in place(InstanceGroup("c", "KIND_CPU", 0))] == ["c_0"]


def test_cpu_groups_stay_on_the_cpu_beside_gpu_groups():
    got = place(InstanceGroup("c", "KIND_CPU", 2), InstanceGroup("g", "KIND_GPU", 1, (2,)))
    assert [(p.name, p.device) for p in got] == [("c_0", Device("cpu")), ("c_1", Device("cpu")),
                                                 ("g_0", Device("cuda", 2))]
