"""A tensor in device memory, where the request path expects a numpy array.

Inputs read from a CUDA shared memory region, and the outputs of an ensemble
step kept on its GPU for the next step, travel as :class:`DeviceTensor`: a torch
tensor (on ``cuda:k``, or on the CPU where tests stand in for a GPU) with the
numpy ``dtype`` and ``shape`` the model path checks. A TorchScript instance on
the same device takes it as is (DLPack / torch, no host copy); anything that
needs host memory calls ``np.asarray`` on it (or :meth:`DeviceTensor.to_host`) and
gets one copy, made once and kept.

torch is imported lazily: a host that never sees a device tensor never loads it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferd.dtypes import BY_NAME, from_numpy


def torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    """The torch dtype for a numpy dtype that has a protocol type (not BYTES)."""
    name = from_numpy(dtype).name
    table = {
        "BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
        "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "BF16": torch.bfloat16,
        "FP32": torch.float32, "FP64": torch.float64,
        "UINT16": getattr(torch, "uint16", None), "UINT32": getattr(torch, "uint32", None),
        "UINT64": getattr(torch, "uint64", None),
    }
    found = table.get(name)
    if found is None:
        raise TypeError(f"data type {name} cannot live in device memory here (this torch has no {name})")
    return found


def host_array(torch: Any, tensor: Any) -> np.ndarray:
    """A numpy array of a CPU torch tensor, sharing its memory (BF16 as ml_dtypes.bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BY_NAME["BF16"].numpy)
    return tensor.numpy()


class DeviceTensor:
    """``data``: a contiguous torch tensor; ``dtype``: its numpy dtype. Never written in place."""

    __slots__ = ("data", "dtype", "_host")

    def __init__(self, data: Any, dtype: np.dtype) -> None:
        self.data = data
        self.dtype = np.dtype(dtype)
        self._host: np.ndarray | None = None

    @classmethod
    def of(cls, tensor: Any) -> "DeviceTensor":
        """Wrap a torch tensor, reading its numpy dtype."""
        import torch

        if tensor.dtype == torch.bfloat16:
            return cls(tensor, BY_NAME["BF16"].numpy)  # type: ignore[arg-type]
        return cls(tensor, torch.empty(0, dtype=tensor.dtype).numpy().dtype)

    # -- what the model path reads of an array ------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return self.data.dim()

    @property
    def size(self) -> int:
        return int(self.data.numel())

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:k"``, as torch names it."""
        return str(self.data.device)

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def reshape(self, *shape: Any) -> "DeviceTensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return DeviceTensor(self.data.reshape(shape), self.dtype)

    def __getitem__(self, key: Any) -> "DeviceTensor":
        return DeviceTensor(self.data[key], self.dtype)

    # -- host copies and DLPack ------------------------------------------------------------

    def to_host(self) -> np.ndarray:
        """The values in host memory: one device-to-host copy, made on first use and kept."""
        if self._host is None:
            import torch

            host = host_array(torch, self.data.detach().cpu())
            host.flags.writeable = False
            self._host = host
        return self._host

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.to_host()
        return host if dtype is None else host.astype(dtype)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.data.__dlpack_device__()

    def __repr__(self) -> str:
        return f"DeviceTensor({self.shape}, {self.dtype}, {self.device})"


def is_device_tensor(value: object) -> bool:
    return isinstance(value, DeviceTensor)


def to_host(value: Any) -> Any:
    """``value`` in host memory: a DeviceTensor copied, anything else as it is."""
    return value.to_host() if isinstance(value, DeviceTensor) else value
