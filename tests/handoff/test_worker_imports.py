"""What a frontend worker process loads (issue 26): the core types, the façade, the wire protocol and the
frontends; nothing of the models. Walked in a fresh interpreter after importing the worker's entry
(inferd.serve.worker_process imports everything the worker runs at its top), then again with the
core's side imported as well, so the walk is seen to find what it looks for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a worker may load of inferd: the core layer, the façade, the wire (generated code, with its JSON
# rendering), the frontends, the hand-off's shared protocol and worker side, and the worker's entry.
ALLOWED = ("inferd._proto", "inferd.types", "inferd.errors", "inferd.clock", "inferd.event_loop", "inferd.dtypes",
           "inferd.streaming", "inferd.suggest", "inferd.host", "inferd.gpu", "inferd.observability", "inferd.facade",
           "inferd.frontends", "inferd.handoff.messages", "inferd.handoff.worker", "inferd.ipc", "inferd.serve.worker_process")
# Never in a worker: the core's side, the data plane's implementation, the layers that hold the models,
# and the runtimes and libraries only they use.
FORBIDDEN = ("inferd.handoff.core", "inferd.dataplane", "inferd.config", "inferd.model", "inferd.repository", "inferd.scheduling",
             "inferd.ensemble", "inferd.backends", "inferd.batchjobs", "inferd.serve.one_process",
             "inferd.serve.core_process", "inferd.serve.supervisor", "triton_python_backend_utils", "torch", "onnxruntime", "pyarrow", "tqdm")
CORE_COSTS_AT_LEAST = 2 << 20  # bytes of RSS the core's side adds to a worker's interpreter (measured: ~3.4 MB)

PROBE = """
import json, sys

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

import inferd.serve.worker_process
worker = sorted(sys.modules), rss()
import inferd.serve.core_process
core = sorted(sys.modules), rss()
print(json.dumps({"worker": worker, "with_core": core}))
"""


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_worker_loads_the_frontends_and_nothing_of_the_models() -> None:
    found = _probe()
    modules, rss = found["worker"]
    inferd_modules = [m for m in modules if m.startswith("inferd.")]
    assert {"inferd.handoff.worker.proxy", "inferd.frontends.grpc_service", "inferd.frontends.http_service",
            "inferd.facade"} <= set(modules)
    assert [m for m in inferd_modules if not _under(m, ALLOWED) and m not in ("inferd.handoff", "inferd.serve")] == []
    assert [m for m in modules if _under(m, FORBIDDEN)] == []
    # The walk finds what it looks for: the core's side brings the models' layers in.
    with_core, core_rss = found["with_core"]
    assert {"inferd.dataplane.plane", "inferd.repository.manager", "inferd.scheduling.batcher",
            "inferd.backends"} <= {m for m in with_core if _under(m, FORBIDDEN)}
    # A worker starts without paying for them.
    assert core_rss - rss >= CORE_COSTS_AT_LEAST, (rss, core_rss)
    print(f"worker: {len(modules)} modules ({len(inferd_modules)} of inferd), RSS {rss / 2**20:.1f} MiB; "
          f"with the core's side: {len(with_core)} modules, RSS {core_rss / 2**20:.1f} MiB")
