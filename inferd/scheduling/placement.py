"""Where each instance of a model runs, from its ``instance_group`` list, as Triton decides it.

A pure decision over plain data: the groups, the GPUs visible here (a
:class:`~inferd.gpu.inventory.GpuInventory` read by the caller) and whether the
model's backend can run on a GPU at all. Called once per load, before any
instance is created, so a bad group never half-loads a model.

Triton's rules (core ``model_config_utils.cc``), which this follows:

- ``KIND_GPU`` without ``gpus`` places ``count`` instances on *every* visible GPU;
  with ``gpus: [...]`` on those listed. A listed index that is not visible is
  refused at load, naming the model, the group, the index and the visible ones.
  ``KIND_GPU`` on a host with no GPU is refused.
- ``KIND_AUTO`` is ``KIND_GPU`` when GPUs are visible and every listed index is one
  of them, else ``KIND_CPU``. Unlike Triton, a backend that cannot use a GPU here
  (onnxruntime without its CUDA provider) also makes it ``KIND_CPU``: Triton would
  load and fail inside the backend; inferd serves on the CPU instead.
- Instances are created count-major, as Triton creates them: one on each listed GPU,
  then a second on each, ..., so the first instances the pool hands work to are
  spread over the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from inferd.backends.base import Device
from inferd.errors import ConfigError
from inferd.gpu.inventory import MIN_COMPUTE_CAPABILITY

KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")


class InstanceGroupLike(Protocol):
    """What placement reads of one ``instance_group`` entry."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...  # one of KINDS
    @property
    def count(self) -> int: ...  # 0: the default (1)
    @property
    def gpus(self) -> Sequence[int]: ...


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """One ``instance_group`` entry as plain data (what :func:`place_instances` takes)."""

    name: str = ""
    kind: str = "KIND_AUTO"
    count: int = 0
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """One instance to create: its name, its group's name and its device."""

    name: str
    group: str
    device: Device


def place_instances(model: str, groups: Iterable[InstanceGroupLike], visible: Sequence[int], *,
                    backend: str, backend_gpu: bool) -> list[Placement]:
    """Every instance ``groups`` ask for, in creation order; raises ConfigError for a group
    that cannot be placed here. ``visible``: the GPU indexes of the inventory;
    ``backend_gpu``: whether ``backend`` can run on them (torch with CUDA, onnxruntime
    with its CUDA execution provider)."""
    chosen = list(groups) or [InstanceGroup()]  # Triton's default: one KIND_AUTO group
    placements: list[Placement] = []
    for gi, group in enumerate(chosen):
        name = group.name or f"{model}_{gi}"
        where = f"model '{model}': instance_group[{gi}] '{name}'"
        count = group.count or 1
        kind = _resolve_kind(group, visible, backend_gpu)
        if kind == "KIND_GPU":
            gpus = _gpus(where, group, visible, backend, backend_gpu)
            # Triton names every device's c-th instance "<group>_<c>"; inferd keeps names unique
            # by numbering the group's instances in creation order instead.
            devices = [gpu for _ in range(count) for gpu in gpus]
            placements += [Placement(f"{name}_{k}", name, Device("cuda", gpu)) for k, gpu in enumerate(devices)]
        else:
            placements += [Placement(f"{name}_{i}", name, Device("cpu")) for i in range(count)]
    return placements


def _resolve_kind(group: InstanceGroupLike, visible: Sequence[int], backend_gpu: bool) -> str:
    if group.kind != "KIND_AUTO":
        return group.kind
    if not visible or not backend_gpu or any(g not in visible for g in group.gpus):
        return "KIND_CPU"
    return "KIND_GPU"


def _gpus(where: str, group: InstanceGroupLike, visible: Sequence[int], backend: str,
          backend_gpu: bool) -> tuple[int, ...]:
    if not visible:
        raise ConfigError(f"{where} has kind KIND_GPU but no GPUs are available here; use KIND_CPU or KIND_AUTO")
    if not backend_gpu:
        raise ConfigError(
            f"{where} has kind KIND_GPU but backend '{backend}' cannot run on a GPU here "
            f"({_why_not(backend)}); use KIND_CPU or KIND_AUTO"
        )
    if not group.gpus:
        return tuple(visible)
    seen = ", ".join(str(v) for v in visible)
    for gpu in group.gpus:
        if gpu not in visible:
            raise ConfigError(
                f"{where} asks for GPU {gpu}, which is not a usable GPU here; the visible GPUs are {seen} "
                f"(CUDA_VISIBLE_DEVICES and a compute capability of at least "
                f"{MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} decide which)"
            )
    return tuple(group.gpus)  # as in Triton, a GPU listed twice gets count instances twice


def _why_not(backend: str) -> str:
    if backend == "onnxruntime":
        return "this onnxruntime has no CUDAExecutionProvider; install onnxruntime-gpu"
    if backend in ("pytorch", "python"):
        return "this torch has no CUDA"
    return "it has no GPU support"
