"""Building a loaded model version (:class:`inferd.model.Model`): its instances,
warm-up, scheduler and statistics, from the plain :class:`ModelSpec`."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from inferd.backends import Backend, Device, InferenceDispatcher, InstanceSpec, ModelInstance
from inferd.clock import Clock
from inferd.config import KIND_AUTO, KIND_CPU, KIND_GPU, ModelSpec
from inferd.errors import ConfigError
from inferd.model import Model
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import Scheduler
from inferd.scheduling.batcher import BatchScheduler
from inferd.scheduling.instances import InstanceWorker
from inferd.repository.warmup import run_warmup, warmup_samples
from inferd.scheduling.policy import batching_policy
from inferd.scheduling.sequence import SequenceScheduler, sequence_sample


def instance_specs(spec: ModelSpec, backend: Backend, model_dir: Path, version: int, model_file: Path,
                   dispatcher: InferenceDispatcher | None = None) -> list[InstanceSpec]:
    """One InstanceSpec per instance that ``instance_group`` asks for."""
    devices: list[tuple[str, Device]] = []
    for gi, group in enumerate(spec.instance_groups):
        count = group.count or 1
        kind = group.kind
        if kind == KIND_AUTO:
            kind = KIND_GPU if backend.gpu_available() else KIND_CPU
        base = group.name or f"{spec.name}_{gi}"
        if kind == KIND_GPU:
            if not backend.gpu_available():
                raise ConfigError(
                    f"model '{spec.name}': instance_group[{gi}] asks for KIND_GPU but backend "
                    f"'{backend.name}' has no CUDA device here"
                )
            gpus = list(group.gpus) or [0]
            for gpu in gpus:
                for i in range(count):
                    devices.append((f"{base}_{gpu}_{i}" if len(gpus) > 1 else f"{base}_{i}", Device("cuda", gpu)))
        else:
            for i in range(count):
                devices.append((f"{base}_{i}", Device("cpu")))
    cpu_instances = sum(1 for _, d in devices if d.kind == "cpu") or 1
    threads = max(1, (os.cpu_count() or 1) // cpu_instances)
    return [
        InstanceSpec(name=name, device=device, model_dir=model_dir, version_dir=model_dir / str(version),
                     version=version, model_file=model_file, threads=threads, dispatcher=dispatcher)
        for name, device in devices
    ]


def sample_inputs(spec: ModelSpec) -> dict[str, np.ndarray]:
    """One row of zeros per input (variable dimensions as 1), in model shapes."""
    lead = (1,) if spec.max_batch_size > 0 else ()
    out = {}
    for t in spec.inputs.values():
        shape = lead + tuple(1 if d == -1 else d for d in t.model_dims)
        if t.datatype.name == "BYTES":
            out[t.name] = np.full(shape, b"", dtype=np.object_)
        else:
            out[t.name] = np.zeros(shape, dtype=t.datatype.numpy)
    return out


def build_model(
    spec: ModelSpec, backend: Backend, model_dir: Path, version: int, model_file: Path, clock: Clock | None = None,
    dispatcher: InferenceDispatcher | None = None,
) -> Model:
    """Create every instance and the scheduler; blocking (runtimes load here).
    ``dispatcher``: how the instances reach other models (BLS); None outside a server."""
    params = spec.params
    policy = batching_policy(spec.max_batch_size, spec.dynamic_batching, aging_us=params.priority_aging_microseconds,
                             split=params.split_large_requests)
    sequence = spec.sequence  # None without sequence_batching
    instances = []
    ispecs = instance_specs(spec, backend, model_dir, version, model_file, dispatcher)
    samples = warmup_samples(spec, model_dir) if spec.warmup else None

    def create(ispec: InstanceSpec) -> ModelInstance:
        instance = backend.create_instance(spec, ispec)
        if samples is not None:  # before the version can report ready
            try:
                run_warmup(spec, instance, samples)
            except BaseException:
                instance.close()
                raise
        return instance

    try:
        for ispec in ispecs:
            instances.append(create(ispec))
    except BaseException:
        for instance in instances:
            instance.close()
        raise
    timeout = params.execution_timeout_microseconds
    workers = [
        InstanceWorker(i, "thread" if i.thread_only or timeout else params.execution, params.inline_max_microseconds,
                       timeout_us=timeout, rebuild=functools.partial(create, ispec),
                       max_retired=params.max_retired_instances, clock=clock)
        for i, ispec in zip(instances, ispecs)
    ]
    if any(w.mode == "auto" for w in workers):
        sample = sample_inputs(spec)
        if sequence is not None:
            sample.update(sequence_sample(sequence))
        for worker in workers:
            if worker.mode == "auto":
                worker.calibrate(sample, list(spec.outputs))
    stats = ModelStats(spec.name, version)
    scheduler: Scheduler
    if sequence is not None:
        scheduler = SequenceScheduler(spec.name, sequence, workers, list(spec.outputs), stats, clock)
    else:
        scheduler = BatchScheduler(spec.name, policy, workers, list(spec.outputs), stats, clock)
    return Model(spec=spec, version=version, scheduler=scheduler, stats=stats, model_dir=model_dir,
                 decoupled=spec.decoupled)
