"""The layering of docs/ARCHITECTURE.md, enforced (issue #12).

Layers, lowest first, each importing only those below it (or itself); every
import counts, also one inside a function or under ``TYPE_CHECKING``. Protobuf
and gRPC stay in the generated code, config/ and the frontends (and the tools
above them); the frontends reach the data plane only through its façade.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from inferd import errors
from inferd.facade import DataPlaneAPI, GrpcFastPath
from inferd.frontends.status import STATUS

ROOT = Path(__file__).resolve().parent.parent

# (layer, module prefixes); the longest matching prefix decides a module's layer. The folders name the
# processes: frontends/ and handoff/worker/ run in a frontend worker, serve/ wires processes together, the rest
# (with handoff/core/) runs in the core.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("proto", ("inferd._proto",)),
    # inferd.facade: the data plane's façade and the plain data it speaks, importing only the core types,
    # so that a frontend worker process (which loads it) loads nothing of the models. inferd.ipc: the channel
    # and arenas every process pair speaks over.
    ("core", ("inferd.types", "inferd.errors", "inferd.clock", "inferd.event_loop", "inferd.dtypes", "inferd.streaming",
              "inferd.observability", "inferd.suggest", "inferd.gpu", "inferd.host", "inferd.facade", "inferd.ipc")),
    ("config", ("inferd.config",)),
    ("backends", ("inferd.backends", "triton_python_backend_utils")),
    ("hosts", ("inferd.hosts",)),  # model hosts: the core's side of each and what runs inside one
    ("scheduling", ("inferd.scheduling",)),
    ("model", ("inferd.model",)),
    ("ensemble", ("inferd.ensemble",)),
    ("repository", ("inferd.repository",)),
    ("batchjobs", ("inferd.batchjobs",)),  # the job engine, over an injected infer
    ("dataplane", ("inferd.dataplane",)),  # with the Prometheus exporter, which reads the models' counters
    ("frontends", ("inferd.frontends", "inferd.handoff")),  # the hand-off to the core is a frontend tier too
    ("serve", ("inferd.serve",)),  # process wiring: every process's entry and what ties them together
    ("cli", ("inferd.cli", "inferd.batch_cli", "inferd.perf", "inferd.tune", "inferd.examples", "inferd.deploy")),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
# Where protobuf and gRPC may be imported: the generated code, config/, the frontends and the tools above them.
WIRE_LAYERS = {"proto", "config", "frontends", "serve", "cli"}
WIRE_MODULES = ("grpc", "grpc_health", "grpc_reflection", "google.protobuf", "inferd._proto.model_config_pb2",
                "inferd._proto.grpc_service_pb2", "inferd._proto.grpc_service_pb2_grpc")
# The frontend modules that serve clients: the data plane's façade is all they may use of it.
FACADE_USERS = ("inferd.frontends.grpc_service", "inferd.frontends.http_service", "inferd.frontends.grpc_health")
# What runs in a frontend worker process (its entry, the frontends, the hand-off's worker side) reaches the core
# only through the wire protocol: it never imports the hand-off's core side, the data plane's implementation,
# the config layer or the layers that hold the models (tests/handoff/test_worker_imports.py checks what a
# worker really loads).
WORKER_SIDE = ("inferd.handoff.worker", "inferd.frontends", "inferd.serve.worker_process")
NOT_IN_A_WORKER = ("inferd.handoff.core", "inferd.dataplane", "inferd.model", "inferd.repository", "inferd.scheduling",
                   "inferd.ensemble", "inferd.backends", "inferd.batchjobs", "inferd.config", "inferd.hosts",
                   "inferd.serve.one_process", "inferd.serve.host_process",
                   "inferd.serve.core_process", "inferd.serve.supervisor")
BELOW_THE_FACADE = ("inferd.repository", "inferd.model", "inferd.scheduling", "inferd.ensemble", "inferd.backends",
                    "inferd.batchjobs", "inferd.dataplane")  # the façade is inferd.facade, not inferd.dataplane


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), name)
    return best[1] if best else None


def _modules() -> dict[str, Path]:
    out = {}
    for package in ("inferd", "triton_python_backend_utils"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file; ``from pkg import mod`` counts as ``pkg.mod``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.append((node.lineno, full if full in MODULES or full in WIRE_MODULES else node.module))
    return found


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "inferd" and layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    bad = []
    for module, path in MODULES.items():
        mine = layer_of(module)
        if mine is None:
            continue
        for line, target in imports(path):
            theirs = layer_of(target)
            if theirs is not None and RANK[theirs] > RANK[mine]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} ({mine}) imports {target} ({theirs})")
    assert bad == []


def test_protobuf_and_grpc_stay_in_config_and_the_frontends():
    bad = []
    for module, path in MODULES.items():
        if layer_of(module) in WIRE_LAYERS:
            continue
        for line, target in imports(path):
            if any(target == w or target.startswith(w + ".") for w in WIRE_MODULES):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert bad == []


def _facade_methods() -> set[str]:
    """DataPlaneAPI's methods, and the gRPC fast path's a data plane may add (GrpcFastPath)."""
    return {n for cls in (DataPlaneAPI, GrpcFastPath) for n, v in vars(cls).items()
            if callable(v) and not n.startswith("_")}


@pytest.mark.parametrize("module", FACADE_USERS)
def test_frontends_use_only_the_data_plane_facade(module):
    path = MODULES[module]
    allowed = _facade_methods()
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        # self.dp.<name> / self.fast_path.<name>: the frontend's data plane
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("dp", "fast_path")
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"):
            used.add(node.attr)
    assert used and used <= allowed, sorted(used - allowed)
    below = [t for _, t in imports(path) if any(t == b or t.startswith(b + ".") for b in BELOW_THE_FACADE)]
    assert below == []


def _worker_side_problems(modules: dict[str, Path]) -> list[str]:
    bad = []
    for module, path in modules.items():
        if not any(module == w or module.startswith(w + ".") for w in WORKER_SIDE):
            continue
        for line, target in imports(path):
            if any(target == n or target.startswith(n + ".") for n in NOT_IN_A_WORKER):
                bad.append(f"{module}:{line}: imports {target}")
    return bad


def test_the_worker_side_never_imports_the_core_side_or_the_models():
    for side in WORKER_SIDE:
        assert [m for m in MODULES if m == side or m.startswith(side + ".")], f"nothing found under {side}"
    assert _worker_side_problems(MODULES) == []


def test_the_worker_rule_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from inferd.handoff.core.endpoint import DataPlaneEndpoint\n")
    assert _worker_side_problems({"inferd.handoff.worker.bad": bad}) == [
        "inferd.handoff.worker.bad:2: imports inferd.handoff.core.endpoint"]
    assert _worker_side_problems({"inferd.handoff.core.bad": bad}) == []  # the core side may


def test_every_error_kind_has_a_status():
    kinds = {cls.kind for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.InferdError)}
    assert kinds - set(STATUS) == set()


def test_the_checks_see_a_violation(tmp_path):
    """The walk is not vacuous: an upward and a wire import in a low layer are both found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from inferd.frontends import status\n\ndef f():\n    import grpc\n")
    found = [t for _, t in imports(bad)]
    assert "inferd.frontends.status" in found and "grpc" in found
    assert RANK[layer_of("inferd.frontends.status")] > RANK[layer_of("inferd.scheduling.queue")]
