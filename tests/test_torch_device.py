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
