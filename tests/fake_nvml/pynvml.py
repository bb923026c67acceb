"""A stand-in for nvidia-ml-py's ``pynvml``, for hosts without a GPU.

Tests build a :class:`FakeNvml` directly, or put this folder first on
``PYTHONPATH`` so a server process imports it as ``pynvml``: it then reports
``FAKE_NVML_GPUS`` GPUs (default 2) with the fixed readings below, and GPU 1
cannot read its power limit (as some boards cannot).
"""

from __future__ import annotations

import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, gpus: int = 2, *, init_fails: bool = False, unreadable: dict[int, str] | None = None) -> None:
        self.gpus = gpus
        self.init_fails = init_fails
        self.unreadable = unreadable or {}
        self.initialised = False
        self.energy_mj = [5_000_000 + 1000 * i for i in range(gpus)]

    def _check(self, index: int, what: str) -> None:
        if not self.initialised:
            raise NVMLError("Uninitialized")
        if self.unreadable.get(index) == what:
            raise NVMLError("Not Supported")

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise NVMLError("NVML Shared Library Not Found")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check(-1, "count")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._check(i, "handle")
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h:04d}"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self._check(h, "utilization")
        return SimpleNamespace(gpu=25 * (h + 1), memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self._check(h, "memory")
        return SimpleNamespace(total=(80 << 30) * (h + 1), used=(1 << 30) * (h + 1), free=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._check(h, "power usage")
        return 150_500 + h  # milliwatts

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        self._check(h, "power limit")
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self._check(h, "energy")
        self.energy_mj[h] += 2500  # each reading finds 2.5 J more
        return self.energy_mj[h]


_default = FakeNvml(int(os.environ.get("FAKE_NVML_GPUS", "2")), unreadable={1: "power limit"})
for _name in dir(_default):
    if _name.startswith("nvml"):
        globals()[_name] = getattr(_default, _name)
