"""The GPUs this process can place model instances on.

Placement (``instance_group``) asks a :class:`GpuInventory` which CUDA device
indexes exist, never CUDA itself, so it is decided the same way on a CPU host
in tests (:class:`FakeGpuInventory`) as on a GPU host. The production inventory
is torch's view (:class:`TorchGpuInventory`): the devices that
``CUDA_VISIBLE_DEVICES`` leaves visible, numbered as CUDA numbers them, which
is what ``gpus: [...]`` in a config means (as in Triton). Triton also drops
devices below its minimum compute capability (6.0); so does this inventory.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

# Triton's TRITON_MIN_COMPUTE_CAPABILITY: older devices are not offered for placement.
MIN_COMPUTE_CAPABILITY = (6, 0)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One visible CUDA device."""

    index: int  # the CUDA device ordinal (what ``gpus: [...]`` and ``cuda:k`` name)
    name: str = ""
    uuid: str = ""  # "GPU-xxxxxxxx-...", as NVML and Triton's gpu_uuid label spell it
    total_memory: int = 0  # bytes
    capability: tuple[int, int] = (0, 0)


class GpuInventory(Protocol):
    def gpus(self) -> tuple[GpuInfo, ...]:
        """The devices instances may be placed on, in index order; empty on a CPU host."""
        ...


class FakeGpuInventory:
    """A made-up set of GPUs (tests, and ``--gpus none`` style overrides)."""

    def __init__(self, count: int = 0, *, indexes: tuple[int, ...] | None = None) -> None:
        chosen = tuple(range(count)) if indexes is None else tuple(sorted(indexes))
        self._gpus = tuple(GpuInfo(i, f"Fake GPU {i}", f"GPU-fake-{i:04d}", 80 << 30, (9, 0)) for i in chosen)

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus


class TorchGpuInventory:
    """The CUDA devices torch sees; read once, on first use (CUDA initialises then).

    A torch without CUDA, or a host without a driver, has no GPUs: never an error."""

    def __init__(self) -> None:
        self._gpus: tuple[GpuInfo, ...] | None = None
        self._lock = threading.Lock()

    def gpus(self) -> tuple[GpuInfo, ...]:
        if self._gpus is None:
            with self._lock:
                if self._gpus is None:
                    self._gpus = _torch_gpus()
        return self._gpus


def nvidia_driver_present() -> bool:
    """Whether this host has an NVIDIA driver (its device node or /proc entry): asked before torch,
    which is slow to import, so a CPU host never imports it to learn it has no GPU."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")


def _torch_gpus() -> tuple[GpuInfo, ...]:
    if not nvidia_driver_present():
        return ()
    try:
        import torch

        if not torch.cuda.is_available():
            return ()
        found = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            capability = (int(p.major), int(p.minor))
            if capability < MIN_COMPUTE_CAPABILITY:
                log.warning("GPU %d (%s) has compute capability %d.%d, below %d.%d: not used", i, p.name,
                            *capability, *MIN_COMPUTE_CAPABILITY)
                continue
            uuid = str(getattr(p, "uuid", "") or "")
            if uuid and not uuid.startswith(("GPU-", "MIG-")):
                uuid = "GPU-" + uuid
            found.append(GpuInfo(i, str(p.name), uuid, int(p.total_memory), capability))
        return tuple(found)
    except Exception as exc:  # a broken driver must not stop a CPU-only repository from loading
        log.warning("no GPUs: CUDA could not be queried (%s)", exc)
        return ()


_default: GpuInventory | None = None


def default_inventory() -> GpuInventory:
    """The process's inventory (torch's view), created on first use."""
    global _default
    if _default is None:
        _default = TorchGpuInventory()
    return _default
