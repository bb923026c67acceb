"""The TorchScript instances' host <-> device moves (TorchStager): on the CPU here, the same
code that runs on a GPU with pinned buffers and a stream (tests/test_gpu.py runs it there)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferd.backends.torch_device import TorchStager
from inferd.dtypes import BY_NAME
from inferd.gpu.tensor import DeviceTensor


@pytest.fixture
def stager():
    return TorchStager(torch, torch.device("cpu"))


def test_a_lone_request_is_handed_to_torch_without_a_copy(stager):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = stager.batch_input([x], x.dtype)
    assert t.data_ptr() == x.ctypes.data
    reversed_rows = x[::-1]
    np.testing.assert_array_equal(stager.batch_input([reversed_rows], x.dtype).numpy(), reversed_rows)


def test_a_batch_is_assembled_once_in_request_order(stager):
    parts = [np.full((n, 2), n, dtype=np.int64) for n in (1, 3, 2)]
    t = stager.batch_input(parts, np.dtype(np.int64))
    assert t.shape == (6, 2) and t[:, 0].tolist() == [1, 3, 3, 3, 2, 2]
    assert all(t.data_ptr() != p.ctypes.data for p in parts)


def test_device_tensors_join_without_a_host_round_trip(stager):
    on_device = DeviceTensor.of(torch.tensor([[5.0, 6.0]]))
    host = np.array([[1.0, 2.0]], dtype=np.float32)
    t = stager.batch_input([on_device, host], np.dtype(np.float32))
    assert t.tolist() == [[5.0, 6.0], [1.0, 2.0]]
    alone = stager.batch_input([on_device], np.dtype(np.float32))
    assert alone.data_ptr() == on_device.data.data_ptr()  # the step's tensor itself
    assert on_device._host is None  # never copied to numpy


def test_bf16_and_fp16_inputs_keep_their_bits(stager):
    bf16 = BY_NAME["BF16"].numpy
    x = np.array([[1.5, -2.25]], dtype=bf16)
    assert stager.batch_input([x], x.dtype).dtype == torch.bfloat16
    joined = stager.batch_input([x, x], x.dtype)
    assert joined.dtype == torch.bfloat16 and joined.float().tolist() == [[1.5, -2.25]] * 2
    h = np.array([[0.5]], dtype=np.float16)
    assert stager.batch_input([h, h], h.dtype).dtype == torch.float16


def test_outputs_come_back_as_numpy_or_stay_as_device_tensors(stager):
    y = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    host = stager.outputs({"Y": y})
    assert isinstance(host["Y"], np.ndarray) and host["Y"].tolist() == [[0, 1], [2, 3]]
    kept = stager.outputs({"Y": y.t()}, keep_on_device=True)["Y"]
    assert isinstance(kept, DeviceTensor) and kept.data.is_contiguous()
    assert kept.shape == (2, 2) and kept.dtype == np.float32
    assert np.asarray(kept).tolist() == [[0, 2], [1, 3]]
    assert kept[1:].shape == (1, 2) and len(kept) == 2 and kept.reshape(4).shape == (4,)
    bf = stager.outputs({"B": torch.ones(2, dtype=torch.bfloat16)})["B"]
    assert bf.dtype == BY_NAME["BF16"].numpy


async def test_between_two_torchscript_steps_on_one_device_the_tensors_stay_torch_tensors(tmp_path, monkeypatch):
    """An ensemble of two real TorchScript models on the CPU: the second step gets the first's
    outputs as DeviceTensors (the path cuda:k takes), and the client gets host arrays."""
    from inferd.backends import torch_device
    from inferd.clock import MonotonicClock
    from inferd.examples import torch_models as tm
    from inferd.examples.build import ensemble_steps, triton_config
    from inferd.model import run_model
    from inferd.repository.manager import ModelManager
    from inferd.types import InferenceRequest

    seen: list[list[str]] = []
    real = torch_device.TorchStager.batch_input

    def spy(self, parts, dtype):  # type: ignore[no-untyped-def]
        seen.append([type(p).__name__ for p in parts])
        return real(self, parts, dtype)

    monkeypatch.setattr(torch_device.TorchStager, "batch_input", spy)
    io = ([("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_FP32", [4])],
          [("OUTPUT__0", "TYPE_FP32", [4]), ("OUTPUT__1", "TYPE_FP32", [4])])
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.pt").write_bytes(tm.add_sub())
    (tmp_path / "m" / "config.pbtxt").write_text(triton_config("m", *io, max_batch_size=4, platform="pytorch_libtorch"))
    (tmp_path / "e" / "1").mkdir(parents=True)
    (tmp_path / "e" / "config.pbtxt").write_text(triton_config(
        "e", [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [4])], [("X", "TYPE_FP32", [4]), ("Y", "TYPE_FP32", [4])],
        max_batch_size=4, platform="ensemble", instance_count=0, extra=ensemble_steps([
            ("m", {"INPUT__0": "A", "INPUT__1": "B"}, {"OUTPUT__0": "s", "OUTPUT__1": "d"}),
            ("m", {"INPUT__0": "s", "INPUT__1": "d"}, {"OUTPUT__0": "X", "OUTPUT__1": "Y"})])))
    manager = ModelManager([tmp_path])
    await manager.load_all()
    try:
        assert manager.get("m").tensor_device == "cpu"
        seen.clear()
        a, b = np.full((1, 4), 3, np.float32), np.ones((1, 4), np.float32)
        out = await run_model(manager.get("e"), InferenceRequest("e", {"A": a, "B": b}), MonotonicClock())
    finally:
        await manager.stop()
    assert seen == [["ndarray"], ["ndarray"], ["DeviceTensor"], ["DeviceTensor"]]
    assert isinstance(out["X"], np.ndarray) and out["X"].tolist() == [[6.0] * 4] and out["Y"].tolist() == [[2.0] * 4]
