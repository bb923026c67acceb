"""CUDA shared memory regions on a host without CUDA: FakeCudaIpc hands out host buffers
as a client's cudaMalloc + cudaIpcGetMemHandle would, and the server side opens, reads
and writes them through the same code (torch on the CPU) that runs on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.dtypes import BY_NAME
from inferd.errors import InvalidArgument, NotFound, Unimplemented
from inferd.gpu.cuda_ipc import FakeCudaIpc
from inferd.gpu.tensor import DeviceTensor
from inferd.types import InferenceRequest
from inferd.dataplane.cuda_shared_memory import CudaRegistrar
from inferd.dtypes import encode_bytes

FP32 = BY_NAME["FP32"]


@pytest.fixture
def ipc():
    return FakeCudaIpc(devices=2)


def registrar(ipc, gpus=(0, 1)) -> CudaRegistrar:
    return CudaRegistrar(lambda: gpus, lambda: ipc)


def test_a_registered_region_reads_inputs_as_device_tensors_and_takes_outputs(ipc):
    handle, memory = ipc.allocate(64)
    x = np.arange(8, dtype=np.float32)
    memory[16:48] = x.tobytes()
    region = registrar(ipc).open("in", handle, 1, 64)
    assert region.status() == type(region.status())("in", 1, 64)
    got = region.read(FP32, (2, 4), 16, 32, "input 'x'")
    assert isinstance(got, DeviceTensor) and got.shape == (2, 4) and got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got), x.reshape(2, 4))
    memory[16:48] = bytes(32)  # the client reuses its memory: the request keeps its own copy
    assert got.data[0, 1] == 1.0 and got.data[1, 3] == 7.0

    region.write(np.full(3, 7, np.int32), 0, 16, "output 'y'")
    assert np.frombuffer(bytes(memory[:12]), np.int32).tolist() == [7, 7, 7]
    region.write(DeviceTensor.of(got.data * 2), 16, 32, "output 'z'")  # device to device
    np.testing.assert_array_equal(np.frombuffer(bytes(memory[16:48]), np.float32)[1:], x[1:] * 2)


def test_bytes_tensors_and_bf16_round_trip(ipc):
    handle, memory = ipc.allocate(128)
    region = registrar(ipc).open("r", handle, 0, 128)
    words = np.array([b"ab", b"", b"xyz"], dtype=np.object_)
    encoded = encode_bytes(words)
    region.write(encoded, 0, 128, "output 's'")
    np.testing.assert_array_equal(region.read(BY_NAME["BYTES"], (3,), 0, len(encoded), "input 's'"), words)
    bf16 = BY_NAME["BF16"].numpy
    values = np.array([1.5, -2.0], dtype=bf16)
    region.write(values, 64, 4, "output 'b'")
    back = region.read(BY_NAME["BF16"], (2,), 64, 4, "input 'b'")
    assert back.dtype == bf16 and np.asarray(back).tolist() == values.tolist()


def test_reads_and_writes_outside_the_region_or_of_the_wrong_size_are_refused(ipc):
    handle, _ = ipc.allocate(64)
    region = registrar(ipc).open("r", handle, 0, 32)  # a window smaller than the allocation
    with pytest.raises(InvalidArgument, match="outside the region's 32 bytes"):
        region.read(FP32, (4,), 24, 16, "input 'x'")
    with pytest.raises(InvalidArgument, match="does not match the tensor's 16 bytes"):
        region.read(FP32, (4,), 0, 12, "input 'x'")
    with pytest.raises(InvalidArgument, match="too small; the result needs 40 bytes"):
        region.write(np.zeros(10, np.float32), 0, 32, "output 'y'")
    region.close()
    assert ipc.closed == [handle]
    with pytest.raises(NotFound, match="unregistered"):
        region.read(FP32, (4,), 0, 16, "input 'x'")


def test_registration_is_refused_with_the_region_and_the_reason(ipc):
    handle, _ = ipc.allocate(64)
    with pytest.raises(InvalidArgument, match=r"'r': device_id 3 is not a GPU this server sees; its GPUs are 0, 1"):
        registrar(ipc).open("r", handle, 3, 64)
    with pytest.raises(InvalidArgument, match="raw_handle has 4 bytes; a CUDA IPC handle .* has 64"):
        registrar(ipc).open("r", b"AAAA", 0, 64)
    with pytest.raises(InvalidArgument, match="byte_size 65 is larger than the 64 bytes allocated"):
        registrar(ipc).open("r", handle, 0, 65)
    with pytest.raises(InvalidArgument, match="cannot be opened on GPU 0 .*cudaErrorInvalidValue"):
        registrar(ipc).open("r", b"\1" * 64, 0, 64)
    with pytest.raises(InvalidArgument, match="byte_size must be > 0"):
        registrar(ipc).open("r", handle, 0, 0)
    assert ipc.closed == [handle]  # the oversized one was opened, then closed again


def test_without_cuda_registration_is_refused_naming_the_region_and_why(ipc):
    handle, _ = ipc.allocate(64)
    with pytest.raises(Unimplemented) as info:
        registrar(ipc, gpus=()).open("cu", handle, 0, 64)
    assert "'cu'" in str(info.value) and "no CUDA device" in str(info.value)
    assert "system shared memory" in str(info.value)


def test_without_cuda_python_registration_says_which_package_is_missing(ipc):
    def missing():
        raise ImportError("No module named 'cuda'")

    handle, _ = ipc.allocate(64)
    with pytest.raises(Unimplemented, match="'cu': .*cuda-python"):
        CudaRegistrar(lambda: (0,), missing).open("cu", handle, 0, 64)


# -- through the data plane (one namespace with system regions; a request's tensors) ---------------


def _manager(ipc, gpus=(0,)):  # type: ignore[no-untyped-def]
    from inferd.dataplane.shared_memory import SharedMemoryManager

    return SharedMemoryManager(cuda=registrar(ipc, gpus))


def test_cuda_and_system_regions_share_one_namespace_and_keep_their_own_status(ipc, tmp_path):
    from inferd.errors import AlreadyExists

    (tmp_path / "sys").write_bytes(bytes(64))
    shm = _manager(ipc)
    shm.shm_dir = tmp_path
    handle, _ = ipc.allocate(64)
    shm.register("sys", "/sys", 0, 64)
    shm.register_cuda("gpu", handle, 0, 32)
    with pytest.raises(AlreadyExists):
        shm.register_cuda("sys", handle, 0, 32)
    assert [r.name for r in shm.status()] == ["sys"]
    assert [(r.name, r.device_id, r.byte_size) for r in shm.status(kind="cuda")] == [("gpu", 0, 32)]
    with pytest.raises(NotFound, match="'gpu' is registered as CUDA shared memory, not system shared memory"):
        shm.status("gpu")
    with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'nope'"):
        shm.status("nope", kind="cuda")
    shm.unregister("", kind="system")  # every system region: the CUDA one stays
    assert [r.name for r in shm.status(kind="cuda")] == ["gpu"] and not shm.status()
    shm.unregister("gpu")  # a system unregister does not touch a CUDA region
    assert shm.status(kind="cuda")
    shm.unregister("gpu", kind="cuda")
    assert ipc.closed == [handle] and not shm.status(kind="cuda")


def test_outputs_all_bound_to_cuda_regions_ask_the_model_to_leave_them_on_that_device(ipc):
    from inferd.types import RequestedOutput, SharedTensor, ShmRef

    shm = _manager(ipc)
    h_in, mem_in = ipc.allocate(16)
    h_out, _ = ipc.allocate(16)
    mem_in[:] = np.arange(4, dtype=np.float32).tobytes()
    shm.register_cuda("in", h_in, 0, 16)
    shm.register_cuda("out", h_out, 0, 16)
    req = InferenceRequest("m", {"X": SharedTensor(ShmRef("in", 0, 16, "input 'X'"), FP32, (1, 4))},
                           requested_outputs=[RequestedOutput("Y", shared_memory=ShmRef("out", 0, 16, "output 'Y'"))],
                           shared_memory=True)
    shm.resolve(req)
    assert isinstance(req.inputs["X"], DeviceTensor) and np.asarray(req.inputs["X"]).tolist() == [[0, 1, 2, 3]]
    assert req.output_device == "cpu"  # the fake's "device"; cuda:k on a GPU
    mixed = InferenceRequest("m", {}, requested_outputs=[RequestedOutput("Y", shared_memory=ShmRef("out", 0, 16, "o")),
                                                         RequestedOutput("Z")])
    shm.resolve(mixed)
    assert mixed.output_device is None  # Z goes in the response: the outputs come to the host


async def test_a_torchscript_model_reads_and_writes_cuda_regions_end_to_end(ipc, tmp_path):
    """Inputs and outputs in (fake) CUDA memory through DataPlane.infer: the TorchScript instance gets
    the input as a device tensor and leaves its outputs on the device, written straight into the region."""
    from inferd.dataplane import DataPlane
    from inferd.dataplane.shared_memory import SharedMemoryManager
    from inferd.examples import torch_models as tm
    from inferd.examples.build import triton_config
    from inferd.repository import ModelManager
    from inferd.types import RequestedOutput, SharedTensor, ShmRef

    io = ([("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_FP32", [4])],
          [("OUTPUT__0", "TYPE_FP32", [4]), ("OUTPUT__1", "TYPE_FP32", [4])])
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.pt").write_bytes(tm.add_sub())
    (tmp_path / "m" / "config.pbtxt").write_text(triton_config("m", *io, max_batch_size=4, platform="pytorch_libtorch"))
    dp = DataPlane(ModelManager([tmp_path]), allow_client_shm=True)
    dp.shared_memory = SharedMemoryManager(cuda=registrar(ipc, (0,)))
    await dp.load_models()
    try:
        h_in, mem_in = ipc.allocate(32)
        h_out, mem_out = ipc.allocate(32)
        mem_in[:] = np.array([1, 2, 3, 4, 10, 20, 30, 40], np.float32).tobytes()
        await dp.cuda_shm_register("in", h_in, 0, 32)
        await dp.cuda_shm_register("out", h_out, 0, 32)
        assert [r.name for r in await dp.cuda_shm_status()] == ["in", "out"]
        req = InferenceRequest(
            "m", {"INPUT__0": SharedTensor(ShmRef("in", 0, 16, "input 'INPUT__0'"), FP32, (1, 4)),
                  "INPUT__1": SharedTensor(ShmRef("in", 16, 16, "input 'INPUT__1'"), FP32, (1, 4))},
            requested_outputs=[RequestedOutput("OUTPUT__0", shared_memory=ShmRef("out", 0, 16, "output 'OUTPUT__0'")),
                               RequestedOutput("OUTPUT__1", shared_memory=ShmRef("out", 16, 16, "output 'OUTPUT__1'"))],
            shared_memory=True)
        await dp.infer(req)
        got = np.frombuffer(bytes(mem_out), np.float32)
        assert got.tolist() == [11, 22, 33, 44, -9, -18, -27, -36]
        await dp.cuda_shm_unregister()
        assert not await dp.cuda_shm_status()
    finally:
        await dp.close()
