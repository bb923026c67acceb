"""Building a loaded model version (:class:`inferd.model.Model`): its instances,
warm-up, scheduler and statistics, from the plain :class:`ModelSpec`."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from inferd.backends import Backend, Device, InferenceDispatcher, InstanceSpec, ModelInstance
from inferd.backends.base import sample_inputs
from inferd.backends.session_cache import SessionCache
from inferd.clock import Clock
from inferd.config import ModelSpec, ignored_line, placements
from inferd.errors import ConfigError
from inferd.host import cpu_budget
from inferd.hosts.registry import Hosts
from inferd.model import Model
from inferd.model.cache import ResponseCache
from inferd.observability.stats import ModelStats
from inferd.scheduling.background import BackgroundLane, LanePolicy
from inferd.scheduling.base import Scheduler
from inferd.scheduling.batcher import BatchScheduler
from inferd.scheduling.instances import InstanceWorker
from inferd.scheduling.iterative import IterativeScheduler
from inferd.repository.warmup import run_warmup, warmup_samples
from inferd.scheduling.policy import batching_policy
from inferd.scheduling.rate_limiter import RateLimiter, Ticket
from inferd.scheduling.sequence import SequenceScheduler, sequence_sample

log = logging.getLogger(__name__)


def instance_specs(spec: ModelSpec, backend: Backend, model_dir: Path, version: int, model_file: Path,
                   dispatcher: InferenceDispatcher | None = None,
                   session_cache: SessionCache | None = None) -> list[InstanceSpec]:
    """One InstanceSpec per instance of the (settled, config/_placement.py) instance groups."""
    devices = [(name, Device("cpu") if gpu is None else Device("cuda", gpu), gi)
               for gi, group in enumerate(spec.instance_groups) for name, gpu in placements([group])]
    if any(d.kind == "cuda" for _, d, _ in devices) and not backend.gpu_available():
        # The config was settled for GPUs the backend can use; a backend that changed its mind
        # (a driver gone since) must not get a GPU instance.
        raise ConfigError(f"model '{spec.name}': backend '{backend.name}' has no CUDA device here")
    cpu_instances = sum(1 for _, d, _ in devices if d.kind == "cpu") or 1
    threads = max(1, cpu_budget() // cpu_instances)
    return [
        InstanceSpec(name=name, device=device, model_dir=model_dir, version_dir=model_dir / str(version),
                     version=version, model_file=model_file, threads=threads, group=group, dispatcher=dispatcher,
                     session_cache=session_cache)
        for name, device, group in devices
    ]


def build_model(
    spec: ModelSpec, backend: Backend, model_dir: Path, version: int, model_file: Path, clock: Clock | None = None,
    dispatcher: InferenceDispatcher | None = None, *, cache: ResponseCache | None = None,
    limiter: RateLimiter | None = None, session_cache: SessionCache | None = None, hosts: Hosts | None = None,
) -> Model:
    """Create every instance and the scheduler; blocking (runtimes load here).
    ``dispatcher``: how the instances reach other models (BLS); None outside a server.
    ``cache``: the server's response cache (used when the config enables it);
    ``limiter``: the server's rate limiter (None: ``--rate-limit off``);
    ``session_cache``: where backends keep what a later load of the same file reuses (None: nothing);
    ``hosts``: the server's model hosts, where the instances run when the caller has decided the model
    is hosted (:meth:`Hosts.hosted`; None: every instance in this process)."""
    params = spec.params
    policy = batching_policy(spec)
    sequence = spec.sequence  # None without sequence_batching
    ispecs = instance_specs(spec, backend, model_dir, version, model_file, dispatcher, session_cache)
    instances = []
    samples = warmup_samples(spec, model_dir) if spec.warmup else None

    hosted = hosts is not None

    def create(ispec: InstanceSpec) -> ModelInstance:
        instance = hosts.create(backend, spec, ispec, clock) if hosted else backend.create_instance(spec, ispec)  # type: ignore[union-attr]
        if samples is not None:  # before the version can report ready
            try:
                run_warmup(spec, instance, samples)
            except BaseException:
                instance.close()
                raise
        return instance

    tickets: list[Ticket | None] = []
    try:
        for ispec in ispecs:  # first: a load the resources could never run fails before any runtime loads
            tickets.append(_ticket(spec, ispec, limiter))
        for ispec in ispecs:
            instances.append(create(ispec))
    except BaseException:
        for instance in instances:
            instance.close()
        for ticket in tickets:
            if ticket is not None:
                ticket.close()
        raise
    timeout = params.execution_timeout_microseconds
    workers = [
        InstanceWorker(i, "thread" if i.thread_only or timeout else params.execution, params.inline_max_microseconds,
                       ticket, timeout_us=timeout, rebuild=functools.partial(create, ispec),
                       max_retired=params.max_retired_instances, clock=clock)
        for i, ispec, ticket in zip(instances, ispecs, tickets)
    ]
    if any(w.mode == "auto" for w in workers):
        sample = sample_inputs(spec)
        if sequence is not None:
            sample.update(sequence_sample(sequence))
        for worker in workers:
            if worker.mode == "auto":
                worker.calibrate(sample, list(spec.outputs))
    _warn_ignored(spec, backend, ispecs)
    stats = ModelStats(spec.name, version)
    stats.histogram_buckets = spec.histogram_buckets
    stats.metric_tags = spec.metric_tags
    stats.single_response = not spec.decoupled and not (sequence is not None and sequence.iterative)
    if hosted:  # what its hosts hold of their own, loaded and warmed up: exact, whatever else loads meanwhile
        stats.memory_usage = (("CPU", 0, sum(i.footprint() for i in instances)),)  # type: ignore[attr-defined]
    scheduler: Scheduler
    lowest = policy.priority_levels if policy.priority_levels > 1 else 0
    if sequence is not None and sequence.iterative:
        scheduler = IterativeScheduler(
            spec.name, sequence, workers, list(spec.outputs), stats, clock, decoupled=spec.decoupled,
            end_output=params.iterative_end_output, priority_levels=params.priority_levels,
            default_priority_level=params.default_priority_level)
        lowest = params.priority_levels
    elif sequence is not None:
        scheduler = SequenceScheduler(spec.name, sequence, workers, list(spec.outputs), stats, clock)
    else:
        scheduler = BatchScheduler(spec.name, policy, workers, list(spec.outputs), stats, clock,
                                   joins_rows=backend.joins_batches)
    if spec.response_cache and cache is None:
        log.info("model '%s': response_cache is enabled, but the server has no cache (--cache-config "
                 "local,size=BYTES): its responses are not cached", spec.name)
    devices = {getattr(i, "tensor_device", None) for i in instances}
    # Batch-job work reaches the scheduler only on capacity interactive work leaves idle;
    # an idle server takes a batch's worth per instance at once.
    lane = BackgroundLane(scheduler, LanePolicy(burst=max(1, spec.max_batch_size) * len(workers)), clock, lowest)
    return Model(spec=spec, version=version, scheduler=lane, stats=stats, model_dir=model_dir,
                 decoupled=spec.decoupled, tensor_device=devices.pop() if len(devices) == 1 else None,
                 cache=cache if spec.response_cache else None)


def _ticket(spec: ModelSpec, ispec: InstanceSpec, limiter: RateLimiter | None) -> Ticket | None:
    """The instance's place in the rate limiter; None when it is off or the group has no rate_limiter."""
    group = spec.instance_groups[ispec.group] if ispec.group < len(spec.instance_groups) else None
    if limiter is None or group is None or not group.rate_limited:
        return None
    device = ispec.device.index if ispec.device.kind == "cuda" else 0  # CPU instances: device 0, as in Triton
    return limiter.register(spec.name, ispec.name, device, group.resources, group.rate_priority)


def _warn_ignored(spec: ModelSpec, backend: Backend, ispecs: list[InstanceSpec]) -> None:
    """One warning line per model for the GPU settings its config asks and its backend does not
    honour here (config/_optimization.py), and one per model_metrics family left unused."""
    line = ignored_line(spec.name, backend.ignored_optimizations(spec, {i.device.kind for i in ispecs}))
    if line is not None:
        log.warning("%s", line)
    for warning in spec.load_warnings:
        log.warning("%s", warning)
