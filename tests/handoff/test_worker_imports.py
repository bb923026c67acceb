"""What a frontend worker process loads (issue 26): the core types, the façade, the wire protocol and the
frontends; nothing of the models. Walked in a fresh interpreter after importing the worker's entry
(inferd.serve.worker_process imports what the worker runs at its top, and what only some requests use
where they use it), then after the modules a worker loads on first use, then again with the core's
side imported as well, so the walk is seen to find what it looks for. And how many of inferd's modules
a worker imports at start (issue 45), so that the count cannot creep back."""

from __future__ import annotations

import functools
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
# Issue 45: inferd's modules a worker imports at start (53 before it, 40 after). What few servers or few
# requests use is imported where it is used: LOADED_ON_FIRST_USE.
MAX_INFERD_MODULES = 40
LOADED_ON_FIRST_USE = (
    "inferd.frontends.openai._routes",  # the /v1 frontend, built on the first /v1 request (lazy_routes)
    "inferd.frontends.openai._errors",  # OpenAI's error body: /v1 answers, a refused /v1 body (http_limits)
    "inferd.frontends.http_generate",  # the first generate / generate_stream request
    "inferd.frontends.orca",  # a generate request's load report
    "inferd.observability.stats",  # the first statistics answer (its snapshots unpickle it)
    "inferd._proto.json",  # the first model config answer over HTTP
    "inferd.suggest",  # a did-you-mean hint (a bad request datatype)
    "inferd.ipc.tally",  # a server that bounds held calls (--grpc-max-held-calls)
    "inferd.observability.memtrace",  # INFERD_TRACEMALLOC
)

PROBE = """
import json, sys

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

import inferd.serve.worker_process
worker = sorted(sys.modules), rss()
for name in sys.argv[1:]:
    __import__(name)
first_use = sorted(sys.modules), rss()
import inferd.serve.core_process
core = sorted(sys.modules), rss()
print(json.dumps({"worker": worker, "first_use": first_use, "with_core": core}))
"""


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _beside_the_worker(modules: list[str]) -> list[str]:
    """inferd's modules in ``modules`` that are not of the worker's side (ALLOWED, and the packages above)."""
    return [m for m in modules if m.startswith("inferd.") and not _under(m, ALLOWED)
            and m not in ("inferd.handoff", "inferd.serve")]


@functools.cache
def _probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *LOADED_ON_FIRST_USE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_worker_loads_the_frontends_and_nothing_of_the_models() -> None:
    found = _probe()
    modules, rss = found["worker"]
    inferd_modules = [m for m in modules if m.startswith("inferd.")]
    assert {"inferd.handoff.worker.proxy", "inferd.frontends.grpc_service", "inferd.frontends.http_service",
            "inferd.facade"} <= set(modules)
    assert _beside_the_worker(modules) == []
    assert [m for m in modules if _under(m, FORBIDDEN)] == []
    # What it loads on first use is of the worker's side too.
    used, used_rss = found["first_use"]
    assert _beside_the_worker(used) == []
    assert [m for m in used if _under(m, FORBIDDEN)] == []
    # The walk finds what it looks for: the core's side brings the models' layers in.
    with_core, core_rss = found["with_core"]
    assert {"inferd.dataplane.plane", "inferd.repository.manager", "inferd.scheduling.batcher",
            "inferd.backends"} <= {m for m in with_core if _under(m, FORBIDDEN)}
    # A worker starts without paying for them, even once it has used all it can.
    assert core_rss - used_rss >= CORE_COSTS_AT_LEAST, (used_rss, core_rss)
    print(f"worker: {len(modules)} modules ({len(inferd_modules)} of inferd), RSS {rss / 2**20:.1f} MiB; "
          f"with the core's side: {len(with_core)} modules, RSS {core_rss / 2**20:.1f} MiB")


def test_a_worker_imports_at_most_40_of_inferds_modules_at_start() -> None:
    """Issue 45: a fresh interpreter importing the worker's entry, counted as the issue counts (inferd's
    own modules, the packages included). What only some servers or requests use loads on first use."""
    modules, _ = _probe()["worker"]
    inferd_modules = [m for m in modules if _under(m, ("inferd",))]
    assert len(inferd_modules) <= MAX_INFERD_MODULES, (len(inferd_modules), inferd_modules)
    assert [m for m in LOADED_ON_FIRST_USE if m in modules] == []


def test_a_worker_reads_the_variable_memtrace_reads() -> None:
    """The worker imports memtrace only when INFERD_TRACEMALLOC is set, reading the variable itself."""
    from inferd.observability import memtrace
    from inferd.serve import worker_process

    assert worker_process.TRACEMALLOC_ENV == memtrace.ENV
