"""A backend is one class: registered from code or through the ``inferd.backends`` entry point
group, it is found by name, by its model file's suffix, and config validation asks its class
attributes (inferd.config.BackendCapabilities) what its models may ask; no config module names it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from inferd import backends
from inferd.backends import Backend, InstanceSpec
from inferd.backends.base import TensorInstance
from inferd.config import ModelSpec
from inferd.errors import ConfigError
from inferd.repository.manager import ModelManager, prepare
from inferd.types import InferenceRequest

IO = ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
      'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')


class ScaleInstance(TensorInstance):
    """Y = X times the number in the model file, for a whole joined batch at once."""

    def __init__(self, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        self.factor = np.float32(float(instance.model_file.read_text()))

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        return {"Y": inputs["X"] * self.factor}


class ScaleBackend(Backend):
    name = "scale"
    default_filename = "model.scale"
    file_suffixes = (".scale",)

    def create_instance(self, spec: ModelSpec, instance: InstanceSpec) -> ScaleInstance:
        return ScaleInstance(spec, instance)


class LooseScaleBackend(ScaleBackend):
    """The same runtime answering two questions differently."""

    name = "loose_scale"
    file_suffixes = ()
    undeclared_inputs = True
    gpu_requirement = "it needs a scaling accelerator"


@pytest.fixture
def registered():
    made = [backends.register(ScaleBackend), backends.register(LooseScaleBackend)]
    yield made
    for backend in made:
        backends.unregister(backend.name)


def _folder(repo: Path, name: str, config: str, factor: str = "3") -> Path:
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.scale").write_text(factor)
    (model / "config.pbtxt").write_text(f'name: "{name}"\n' + config)
    return model


async def test_a_registered_class_serves_a_model_found_by_its_file_suffix(registered, tmp_path):
    _folder(tmp_path, "tripled", "max_batch_size: 4\ndynamic_batching { }\n" + IO)  # no platform, no backend
    manager = ModelManager([tmp_path])
    await manager.load_all()
    try:
        index = {e.name: e for e in manager.index()}
        assert index["tripled"].state == "READY", index["tripled"].reason
        model = manager.get("tripled")
        assert model.spec.backend == "scale"
        x = np.array([[1.0, 2.0]], np.float32)
        out = await model.scheduler.infer(InferenceRequest("tripled", {"X": x}), 1)
        np.testing.assert_array_equal(out["Y"], x * 3)
    finally:
        await manager.stop()


def test_validation_asks_the_backend_not_its_name(registered, tmp_path):
    """A config listing no input is the loose backend's right and the tensor backend's error;
    KIND_GPU on a GPU the backend cannot use names the backend and its own requirement."""
    no_inputs = 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    loose = prepare("loose", _folder(tmp_path, "loose", 'backend: "loose_scale"\n' + no_inputs))
    assert loose.backend is backends.get("loose_scale") and loose.spec.inputs == {}
    with pytest.raises(ConfigError, match="model 'strict': the config lists no input"):
        prepare("strict", _folder(tmp_path, "strict", 'backend: "scale"\n' + no_inputs))
    gpu = 'backend: "loose_scale"\n' + IO + "instance_group [ { kind: KIND_GPU } ]\n"
    with pytest.raises(ConfigError) as info:
        prepare("on_gpu", _folder(tmp_path, "on_gpu", gpu), gpus=(0,))
    assert "backend 'loose_scale' cannot run on a GPU here (it needs a scaling accelerator)" in str(info.value)


def test_padding_is_for_backends_that_join_batches(registered, tmp_path):
    padded = ('backend: "scale"\nmax_batch_size: 4\ndynamic_batching { }\n'
              'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
              'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
              'parameters { key: "inferd.padding" value { string_value: "true" } }\n')
    assert prepare("padded", _folder(tmp_path, "padded", padded)).spec.varlen is not None

    class NoJoin(ScaleBackend):
        name = "no_join"
        file_suffixes = ()
        joins_batches = False

    backends.register(NoJoin)
    try:
        with pytest.raises(ConfigError, match="model 'unjoined': inferd.padding .* not backend 'no_join'"):
            prepare("unjoined", _folder(tmp_path, "unjoined", padded.replace('"scale"', '"no_join"')))
    finally:
        backends.unregister("no_join")


def test_register_refuses_what_is_not_a_named_backend_or_a_taken_name(registered):
    with pytest.raises(ValueError, match="a backend called 'scale' is registered already"):
        backends.register(ScaleBackend)
    with pytest.raises(ValueError, match="'onnxruntime' is registered already"):
        backends.register(type("Again", (ScaleBackend,), {"name": "onnxruntime"}))
    with pytest.raises(TypeError, match="not a subclass of inferd.backends.Backend"):
        backends.register(object)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has no name"):
        backends.register(type("Nameless", (ScaleBackend,), {"name": ""}))


PLUGIN = '''
from inferd.backends import Backend


class PluginBackend(Backend):
    name = "plugin_scale"
    default_filename = "model.plug"
    file_suffixes = (".plug",)

    def create_instance(self, spec, instance):
        raise NotImplementedError
'''


def test_a_third_party_backend_is_found_through_its_entry_point(tmp_path, monkeypatch, caplog):
    """A distribution on sys.path (a dist-info, as pip writes it) declaring two entry points:
    one good, one whose object is missing; the good one and the built-ins are registered, the
    broken one is logged by name."""
    (tmp_path / "inferd_plugin_mod.py").write_text(PLUGIN)
    info = tmp_path / "inferd_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: inferd-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[inferd.backends]\n"
                                           "plugin_scale = inferd_plugin_mod:PluginBackend\n"
                                           "broken = inferd_plugin_mod:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_BACKENDS", {})  # a fresh registry, read again (restored after)
    monkeypatch.setattr(backends, "_LOADED", False)
    with caplog.at_level(logging.ERROR, logger="inferd.backends"):
        found = backends.available()
    assert type(found["plugin_scale"]).__name__ == "PluginBackend"
    assert {"onnxruntime", "python"} <= set(found) and "broken" not in found
    assert any("broken = inferd_plugin_mod:Missing" in r.getMessage() for r in caplog.records)


def test_no_config_module_compares_a_backend_name():
    """Comparisons (==, !=, in) against a registered backend's name in inferd/config: there are none,
    validation asks the backend's capabilities instead."""
    import ast

    names = set(backends.available())
    found = []
    for path in sorted((Path(__file__).resolve().parents[2] / "inferd" / "config").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    for const in ast.walk(side):
                        if isinstance(const, ast.Constant) and const.value in names:
                            found.append(f"{path.name}:{node.lineno}: {const.value!r}")
    assert found == []
