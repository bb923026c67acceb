"""Where a model's instances run: its ``instance_group`` list settled as Triton settles it.

Pure decisions over plain data: the groups, the GPU indexes visible here (the
caller reads a :class:`~inferd.gpu.inventory.GpuInventory`, so tests place on a
made-up host of several GPUs) and whether the backend can run on a GPU at all.
:func:`settle_groups` runs in the config pipeline, before validation, so the
config a client reads shows what was chosen (as Triton's does) and a group that
cannot be placed refuses the load before any instance exists;
:func:`placements` lists the instances to create.

Triton's rules (core ``model_config_utils.cc``), which these follow:

- a model without ``instance_group`` has one ``KIND_AUTO`` group; ``count`` 0 is 1;
  a group without a name is ``<model>_<index>``;
- ``KIND_GPU`` without ``gpus`` places ``count`` instances on *every* visible GPU;
  with ``gpus: [...]`` on those listed (one listed twice gets its instances twice).
  An index that is not visible is refused, naming the model, the group, the index
  and the visible ones; ``KIND_GPU`` on a host without a GPU is refused;
- ``KIND_AUTO`` is ``KIND_GPU`` (with every visible GPU) when GPUs are visible, else
  ``KIND_CPU``. Listing ``gpus`` with ``KIND_AUTO`` and a GPU that is not visible
  refuses the load (Triton falls back to ``KIND_CPU`` and then refuses a CPU group
  that lists GPUs; inferd says which GPU is missing instead). Unlike Triton, a
  backend that cannot use a GPU here (onnxruntime without its CUDA provider) makes
  ``KIND_AUTO`` ``KIND_CPU``: Triton would load and fail inside the backend;
- instances are created count-major, as Triton creates them: one on each GPU of
  the group, then a second on each, ..., so the first instances the pool hands
  work to are spread over the GPUs. Triton names each device's c-th instance
  ``<group>_<c>``; inferd keeps names unique by numbering a group's instances in
  creation order.
"""

from __future__ import annotations

from typing import Sequence

from inferd.config._capabilities import BackendCapabilities
from inferd.config._spec import KIND_AUTO, KIND_CPU, KIND_GPU, InstanceGroup
from inferd.errors import ConfigError
from inferd.gpu.inventory import MIN_COMPUTE_CAPABILITY


def settle_groups(model: str, groups: Sequence[InstanceGroup], visible: Sequence[int], *,
                  backend: BackendCapabilities, backend_gpu: bool) -> tuple[InstanceGroup, ...]:
    """``groups`` with names, counts, kinds and GPUs settled; raises ConfigError for a group that
    cannot be placed here. ``visible``: the inventory's GPU indexes; ``backend_gpu``: whether
    ``backend`` can run on them (torch with CUDA, onnxruntime with its CUDA execution provider;
    the caller asks ``backend.gpu_available()``, a test says it)."""
    chosen = list(groups) or [InstanceGroup("", KIND_AUTO, 0)]
    out = []
    for gi, group in enumerate(chosen):
        name = group.name or f"{model}_{gi}"
        where = f"model '{model}': instance_group[{gi}] '{name}'"
        kind = group.kind
        if kind == KIND_AUTO:
            kind = KIND_GPU if visible and backend_gpu else KIND_CPU
            if group.gpus:  # explicit GPUs: they must exist, whichever kind wins
                _check_listed(where, group.gpus, visible)
                kind = KIND_GPU if backend_gpu else KIND_CPU
        gpus = group.gpus
        if kind == KIND_GPU:
            gpus = _gpus(where, group, visible, backend, backend_gpu)
        out.append(InstanceGroup(name, kind, group.count or 1, tuple(gpus)))
    return tuple(out)


def placements(groups: Sequence[InstanceGroup]) -> list[tuple[str, int | None]]:
    """(instance name, GPU index or None for the CPU) of every instance of settled ``groups``,
    in creation order."""
    out: list[tuple[str, int | None]] = []
    for group in groups:
        if group.kind == KIND_GPU:
            devices: list[int | None] = [gpu for _ in range(group.count) for gpu in group.gpus]
        else:
            devices = [None] * group.count
        out += [(f"{group.name}_{k}", device) for k, device in enumerate(devices)]
    return out


def _gpus(where: str, group: InstanceGroup, visible: Sequence[int], backend: BackendCapabilities,
          backend_gpu: bool) -> tuple[int, ...]:
    if not visible:
        raise ConfigError(f"{where} has kind KIND_GPU but no GPUs are available here; use KIND_CPU or KIND_AUTO")
    _check_listed(where, group.gpus, visible)
    if not backend_gpu:
        raise ConfigError(
            f"{where} has kind KIND_GPU but backend '{backend.name}' cannot run on a GPU here "
            f"({backend.gpu_requirement}); use KIND_CPU or KIND_AUTO"
        )
    return tuple(group.gpus) or tuple(visible)


def _check_listed(where: str, gpus: Sequence[int], visible: Sequence[int]) -> None:
    for gpu in gpus:
        if gpu not in visible:
            seen = ", ".join(str(v) for v in visible) if visible else "none"
            raise ConfigError(
                f"{where} asks for GPU {gpu}, which is not a usable GPU here; the visible GPUs are {seen} "
                f"(CUDA_VISIBLE_DEVICES and a compute capability of at least "
                f"{MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} decide which)"
            )

