"""The server's model hosts: which models run in one, and what the server reads of them.

``inferd serve --model-host auto|process|inline`` sets the default: ``auto`` (the default) hosts
the instances of Python models (backend ``python``: user code, which holds the GIL while it runs,
may block, call other models or never return) one per process, as Triton runs them in stub
processes, and keeps ONNX Runtime and TorchScript in the core (their runtimes release the GIL
while they compute), except under a memory budget (``--model-memory-budget``), where models load
and unload while others serve: there it also hosts an ONNX model on CPU whose files reach
:data:`HOST_AT_BYTES` (module comment there). ``process`` hosts every model; ``inline`` none. A
model's own ``inferd.host`` parameter (``process`` or ``inline``) overrides the server's choice.

:class:`Hosts` is owned by the model manager: the live hosted instances (for their footprints,
their custom metrics and the processes a hard exit must kill) and each model's host restarts
(``inferd_model_host_restarts_total``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from inferd.backends.base import InstanceSpec
from inferd.clock import Clock
from inferd.config import KIND_GPU, ModelSpec
from inferd.hosts.zygote import Zygote

if TYPE_CHECKING:
    from inferd.backends import Backend
    from inferd.hosts.instance import HostedInstance

log = logging.getLogger(__name__)

MODES = ("auto", "process", "inline")
DEFAULT_FINALIZE_GRACE = 5.0  # seconds a host's finalize may take at unload before it is killed
# Under a memory budget ``auto`` hosts an ONNX model on CPU from this size of files up. ONNX Runtime builds
# a session holding the GIL, ~1.7 ms a MB of weights (4 MB: ~7 ms, more than a warm request's p99 on the
# 2-core machines here), and every warm request of the core waits for it; a host builds on a core of its
# own and gives back all it held when it exits. A host costs its own private memory, ~10-12 MiB (a 1 MB
# table: 12.7 MiB hosted, most of it the Python pages it dirties after the fork), which below this size
# would be more than twice the model. Measured with many_models's stream (40 tables of 5-60 MB, bench/
# RESULTS.md): every table in the core, warm p99 beside loads 4.0-5.6x the every-model-loaded run's and
# cold p99 4.0-5.1x a load's; with this threshold at 16 MiB (until 12-07) the 8 tables under it built in
# the core made the loop's longest stalls, 1.43-1.63x on the code that maps hosts' arenas off the loop;
# every table hosted (as here) 1.10-1.68x over six runs, each near its run's control (1.10-1.59x: cores
# busy at SCHED_IDLE, no load), and cold p99 0.5-0.7x a load's. TorchScript stays in the core: a host
# would import torch itself (the zygote does not), far more than the model; GPU models too (a CUDA
# context per host).
HOST_AT_BYTES = 4 * 2**20
METRICS_TIMEOUT = 1.0  # a /metrics scrape waits this long for a host's custom metrics


class Hosts:
    def __init__(self, mode: str = "auto", finalize_grace: float = DEFAULT_FINALIZE_GRACE,
                 budgeted: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"--model-host must be one of {', '.join(MODES)}, got '{mode}'")
        if finalize_grace < 0:
            raise ValueError(f"a model host's finalize grace must be >= 0 seconds, got {finalize_grace}")
        self.mode = mode
        self.finalize_grace = finalize_grace
        self.budgeted = budgeted  # --model-memory-budget set: ``auto`` hosts ONNX models too (but the smallest)
        self.instances: list[HostedInstance] = []
        self.restarts: Counter[str] = Counter()  # model name -> host restarts
        # The server's stop sets it (its loop's time): a host still finalizing then is killed.
        self.stop_by: float | None = None
        self.zygote = Zygote()  # forks every host (started with the first one)

    def hosted(self, spec: ModelSpec, backend: "Backend", file_bytes: int = 0) -> bool:
        """Whether ``spec``'s instances run in host processes (module docstring); ``file_bytes``:
        the size of the model's folder."""
        if spec.params.host:
            return spec.params.host == "process"
        if self.mode == "auto":
            return backend.name == "python" or (
                self.budgeted and backend.name == "onnxruntime" and file_bytes >= HOST_AT_BYTES
                and all(g.kind != KIND_GPU for g in spec.instance_groups))  # settled: no KIND_AUTO left
        return self.mode == "process"

    def create(self, backend: "Backend", spec: ModelSpec, instance: InstanceSpec,
               clock: Clock | None = None) -> "HostedInstance":
        """A hosted instance of ``spec``: its host started and the model loaded there (blocking: a loader thread)."""
        from inferd.hosts.instance import HostedInstance

        return HostedInstance(backend.name, spec, instance, self, clock)

    def grace(self, now: float) -> float:
        """How long a host may take to finalize at unload, ``now`` on the loop's clock."""
        if self.stop_by is None:
            return self.finalize_grace
        return max(0.0, min(self.finalize_grace, self.stop_by - now))

    def add(self, instance: "HostedInstance") -> None:
        self.instances.append(instance)

    def remove(self, instance: "HostedInstance") -> None:
        if instance in self.instances:
            self.instances.remove(instance)

    def restarted(self, model: str) -> None:
        self.restarts[model] += 1

    def pids(self) -> list[int]:
        """Every live host process and the zygote (a hard exit kills them with the frontend workers)."""
        zygote = [self.zygote.pid] if self.zygote.pid is not None else []
        return [i.host.pid for i in self.instances if i.host is not None] + zygote

    async def custom_metrics(self) -> list[Any]:
        """Each live host's custom metric families (pb_utils.MetricFamily), as plain data; a host that
        does not answer within METRICS_TIMEOUT is left out of this scrape."""
        asks = [i.ask("metrics") for i in self.instances if i.host is not None]
        if not asks:
            return []
        done = await asyncio.gather(*(asyncio.wait_for(a, METRICS_TIMEOUT) for a in asks), return_exceptions=True)
        return [d for d in done if not isinstance(d, BaseException)]

    def kill_all(self) -> None:
        """At a hard exit: every host, at once, and the zygote."""
        for instance in self.instances:
            if instance.host is not None:
                instance.host.kill()
        self.zygote.kill()
