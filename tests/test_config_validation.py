"""Issue #2: config.pbtxt validation at load (``inferd check`` and RepositoryIndex),
auto-complete from the ONNX file, version_policy, default_model_filename, reshape and
optional inputs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from conftest import ROOT, running
from inferd.errors import ConfigError
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

INT16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def _add_sub(batch: bool = True):
    return om.add_sub(np.int32, 16, batch=batch)


def _with_default_b():
    """C = A + B where B is an initializer the request may override (an optional input)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["C"])], "optional_b",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.full(4, 10, dtype=np.float32), "B")],
    )
    return om._model(graph)


# model name -> (words the load error must contain)
BROKEN = {
    "bad_dtype": ["bad_dtype", "TYPE_FOO"],
    "dup_names": ["dup_names", "input name 'INPUT0' appears twice"],
    "neg_dims": ["neg_dims", "INPUT0", "-2", "-1 for variable"],
    "neg_batch": ["neg_batch", "max_batch_size must be >= 0", "-1"],
    "contradict_dims": ["contradict_dims", "INPUT1", "[8]", "contradict the model file"],
    "contradict_dtype": ["contradict_dtype", "INPUT0", "TYPE_FP32", "TYPE_INT32"],
    "contradict_batch": ["contradict_batch", "INPUT0", "max_batch_size"],
    "wrong_name": ["wrong_name", "'other_name'", "must match its folder"],
    "no_version": ["no_version", "no version folder"],
    "no_file": ["no_file", "no model file 'model.onnx'"],
    "sequence": ["sequence", "sequence_batching.control_input 'START'", "CONTROL_SEQUENCE_START",
                 "int32_false_true"],
    "warmup": ["warmup", "model_warmup 'w'", "no data for inputs", "INPUT0"],
    "unknown_param": ["unknown_param", "inferd.bogus"],
    "missing_input": ["missing_input", "INPUT1", "does not list"],
    "bad_onnx": ["bad_onnx", "cannot load"],
    "bad_version_policy": ["bad_version_policy", "versions [7]"],
    "no_dtype": ["no_dtype", "INPUT0", "data_type is missing"],
    "empty_dims": ["empty_dims", "INPUT0", "dims is empty"],
    "bad_reshape": ["bad_reshape", "INPUT0", "reshape.shape [3]", "[4]"],
    "no_labels": ["no_labels", "OUTPUT0", "labels.txt"],
    "bad_platform": ["bad_platform", "tensorflow_savedmodel", "not supported"],
    "batching_unbatched": ["batching_unbatched", "dynamic_batching", "max_batch_size"],
    "zero_latest": ["zero_latest", "num_versions", "0"],
    "bad_param_value": ["bad_param_value", "inferd.execution", "'fast'"],
}
# Triton's own invalid configurations (server qa/L0_model_config/noautofill_platform and
# autofill_noplatform/ensemble) that inferd used to accept: name -> the exact reason.
FP32_1 = [("OUTPUT", "TYPE_FP32", [1])]
TRITON_RESHAPE = {
    "reshape_nobatch_empty": "model 'reshape_nobatch_empty': input 'INPUT': reshape.shape [] on a model that does "
    "not batch (max_batch_size 0) would make the tensor a scalar, which reshape does not support; give "
    "reshape.shape at least one dimension, or set max_batch_size > 0 (an empty reshape means one value per batch row)",
    "reshape_variable_runs": "model 'reshape_variable_runs': input 'INPUT': reshape.shape [2, -1, 2] and dims "
    "[2, -1] hold different numbers of elements around their variable dimensions (reshape.shape: [2, 2], dims: "
    "[2, 1]); each run of fixed dimensions before, between and after the -1s must hold the same number of "
    "elements in both",
    "reshape_variable_count": "model 'reshape_variable_count': output 'OUTPUT': reshape.shape [2, -1, -1] has 2 "
    "variable dimension(s) but dims [2, -1] has 1; reshape keeps each variable dimension, so both need the same "
    "number of -1",
}
TRITON_ORDERING = {
    "preserve_ordering_levels": "model 'preserve_ordering_levels': dynamic_batching.priority_levels is 3 with "
    "preserve_ordering true; responses sent in arrival order allow one priority level only: set priority_levels "
    "to 0 or 1, or preserve_ordering to false",
    "preserve_ordering_delay": "model 'preserve_ordering_delay': dynamic_batching.priority_queue_policy[1] has "
    "timeout_action DELAY (default_timeout_microseconds 1000) with preserve_ordering true; a delayed request "
    "would hold back every response behind it: use timeout_action REJECT, or preserve_ordering false",
}
TRITON_CONTROL = {
    "control_tensor_multiple": "model 'control_tensor_multiple': sequence_batching: control tensor 'START' is "
    "declared for CONTROL_SEQUENCE_START and for CONTROL_SEQUENCE_READY; a control tensor carries one control "
    "kind: give each control_input its own tensor name",
}
TRITON_ENSEMBLE = {
    "redundant_tensor_as_output": "ensemble 'redundant_tensor_as_output' step 0 (model 'good'): output "
    "'OUTPUT1' is mapped to tensor 'unused', which no step consumes and which is not an ensemble output; leave "
    "the output out of output_map (a step maps only the outputs the ensemble uses), or list the tensor in output",
}
# A plain model whose config is broken and which has no version folder: refused for the config.
TRITON_CONFIG_FIRST = {
    "priority_no_folder": "model 'priority_no_folder': dynamic_batching.default_priority_level must be in "
    "1..priority_levels (3), got 0",
}
for _group in (TRITON_RESHAPE, TRITON_ORDERING, TRITON_CONTROL, TRITON_ENSEMBLE, TRITON_CONFIG_FIRST):
    BROKEN.update({name: [reason] for name, reason in _group.items()})

GOOD = ["good", "auto_batch", "auto_nobatch", "auto_scalar", "v_latest", "v_all", "v_specific", "custom_file", "reshaped",
        "optional_b"]


def build(repo):
    add_model(repo, "good", _add_sub(), config("good", INT16, OUT16, 8))
    add_model(repo, "bad_dtype", _add_sub(), config("bad_dtype", [("INPUT0", "TYPE_FOO", [16])], OUT16, 8))
    add_model(repo, "dup_names", _add_sub(),
              config("dup_names", [("INPUT0", "TYPE_INT32", [16]), ("INPUT0", "TYPE_INT32", [16])], OUT16, 8))
    add_model(repo, "neg_dims", _add_sub(),
              config("neg_dims", [("INPUT0", "TYPE_INT32", [-2]), ("INPUT1", "TYPE_INT32", [16])], OUT16, 8))
    add_model(repo, "neg_batch", _add_sub(), config("neg_batch", INT16, OUT16, -1))
    add_model(repo, "contradict_dims", _add_sub(),
              config("contradict_dims", [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [8])], OUT16, 8))
    add_model(repo, "contradict_dtype", _add_sub(),
              config("contradict_dtype", [("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_INT32", [16])], OUT16, 8))
    # max_batch_size > 0 on a model whose first dimension is fixed to 16.
    add_model(repo, "contradict_batch", _add_sub(batch=False), config("contradict_batch", INT16, OUT16, 8))
    add_model(repo, "wrong_name", _add_sub(), config("other_name", INT16, OUT16, 8))
    add_model(repo, "no_version", None, config("no_version", INT16, OUT16, 8))
    add_model(repo, "no_file", None, config("no_file", INT16, OUT16, 8))
    (repo / "no_file" / "1").mkdir()
    add_model(repo, "sequence", _add_sub(), config("sequence", INT16, OUT16, 8, extra=(
        'sequence_batching { control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }\n')))
    add_model(repo, "warmup", _add_sub(),
              config("warmup", INT16, OUT16, 8, extra='model_warmup [ { name: "w" batch_size: 1 } ]\n'))
    add_model(repo, "unknown_param", _add_sub(), config(
        "unknown_param", INT16, OUT16, 8,
        extra='parameters { key: "inferd.bogus" value { string_value: "1" } }\n'
              'parameters { key: "some_triton_thing" value { string_value: "x" } }\n'))
    add_model(repo, "missing_input", _add_sub(), config("missing_input", INT16[:1], OUT16, 8))
    add_model(repo, "bad_onnx", b"this is not an onnx file", config("bad_onnx", INT16, OUT16, 8))
    add_model(repo, "bad_version_policy", _add_sub(),
              config("bad_version_policy", INT16, OUT16, 8, extra="version_policy { specific { versions: [7] } }\n"))

    add_model(repo, "no_dtype", _add_sub(), config("no_dtype", INT16, OUT16, 8).replace(
        'name: "INPUT0" data_type: TYPE_INT32', 'name: "INPUT0"'))
    add_model(repo, "empty_dims", _add_sub(), config("empty_dims", [("INPUT0", "TYPE_INT32", [])] + INT16[1:], OUT16, 8))
    add_model(repo, "bad_reshape", om.identity(np.float32, [2, 2], batch=True), config(
        "bad_reshape", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [2, 2])], 4,
        input_extra={"INPUT0": "reshape: { shape: [ 3 ] }"}))
    add_model(repo, "no_labels", om.identity(np.float32, [4], batch=True), config(
        "no_labels", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 4,
        output_extra={"OUTPUT0": 'label_filename: "labels.txt"'}))
    add_model(repo, "bad_platform", _add_sub(), config("bad_platform", INT16, OUT16, 8, platform="tensorflow_savedmodel"))
    add_model(repo, "batching_unbatched", _add_sub(batch=False),
              config("batching_unbatched", INT16, OUT16, 0, extra="dynamic_batching { }\n"))
    add_model(repo, "zero_latest", _add_sub(),
              config("zero_latest", INT16, OUT16, 8, extra="version_policy { latest { num_versions: 0 } }\n"))
    add_model(repo, "bad_param_value", _add_sub(), config(
        "bad_param_value", INT16, OUT16, 8, extra='parameters { key: "inferd.execution" value { string_value: "fast" } }\n'))

    _build_triton_refused(repo)

    # auto-complete: no config.pbtxt at all
    add_model(repo, "auto_batch", _add_sub(), None)
    add_model(repo, "auto_nobatch", _add_sub(batch=False), None)
    add_model(repo, "auto_scalar", om.identity(np.float32, [], batch=True), None)  # one value per batch row

    # version policies over versions 1..3 of "OUTPUT0 = INPUT0 * version"
    for name, policy in (("v_latest", "latest { num_versions: 2 }"), ("v_all", "all { }"),
                         ("v_specific", "specific { versions: [1, 3] }")):
        model_dir = repo / name
        for v in (1, 2, 3):
            add_model(repo, name, om.scale(4, factor=float(v)), None, versions=[v])
        (model_dir / "config.pbtxt").write_text(config(
            name, [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 2,
            extra=f"version_policy {{ {policy} }}\n"))

    add_model(repo, "custom_file", om.scale(4, factor=5.0), config(
        "custom_file", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 2,
        extra='default_model_filename: "net.onnx"\n'), filename="net.onnx")

    # The client sees [4]; the model sees [2, 2].
    add_model(repo, "reshaped", om.identity(np.float32, [2, 2], batch=True), config(
        "reshaped", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 4,
        input_extra={"INPUT0": "reshape: { shape: [ 2, 2 ] }"},
        output_extra={"OUTPUT0": "reshape: { shape: [ 2, 2 ] }"}))

    add_model(repo, "optional_b", _with_default_b(), config(
        "optional_b", [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [4])], [("C", "TYPE_FP32", [4])], 0,
        input_extra={"B": "optional: true"}))


def _build_triton_refused(repo) -> None:
    one = om.identity(np.float32, [1], batch=True)
    add_model(repo, "reshape_nobatch_empty", one, config(
        "reshape_nobatch_empty", [("INPUT", "TYPE_FP32", [1])], FP32_1, 0, input_extra={"INPUT": "reshape { shape: [ ] }"}))
    add_model(repo, "reshape_variable_runs", one, config(
        "reshape_variable_runs", [("INPUT", "TYPE_FP32", [2, -1])], FP32_1, 4,
        input_extra={"INPUT": "reshape { shape: [ 2, -1, 2 ] }"}))
    add_model(repo, "reshape_variable_count", one, config(
        "reshape_variable_count", [("INPUT", "TYPE_FP32", [1])], [("OUTPUT", "TYPE_FP32", [2, -1])], 4,
        output_extra={"OUTPUT": "reshape { shape: [ 2, -1, -1 ] }"}))
    int1 = ([("INPUT", "TYPE_INT32", [1])], [("OUTPUT", "TYPE_INT32", [1])])
    add_model(repo, "preserve_ordering_levels", one, config("preserve_ordering_levels", *int1, 8, extra=(
        "dynamic_batching { preserve_ordering: true priority_levels: 3 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { } } }\n")))
    add_model(repo, "preserve_ordering_delay", one, config("preserve_ordering_delay", *int1, 8, extra=(
        "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
        "priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 1000 } } }\n")))
    add_model(repo, "control_tensor_multiple", one, config("control_tensor_multiple", *int1, 8, extra=(
        "sequence_batching { control_input [ "
        "{ name: \"START\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, "
        "{ name: \"START\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ] }\n")))
    add_model(repo, "priority_no_folder", None, config("priority_no_folder", *int1, 8, extra=(
        "dynamic_batching { priority_levels: 3 }\n")))  # Triton's default_priority_level0, no version folder
    # An ensemble with no version folder: refused for its wiring, as Triton does, not for the folder.
    add_model(repo, "redundant_tensor_as_output", None, config(
        "redundant_tensor_as_output", INT16, [("OUTPUT0", "TYPE_INT32", [16])], 8, platform="ensemble", extra=(
            "ensemble_scheduling { step [ { model_name: \"good\" model_version: -1 "
            "input_map { key: \"INPUT0\" value: \"INPUT0\" } input_map { key: \"INPUT1\" value: \"INPUT1\" } "
            "output_map { key: \"OUTPUT0\" value: \"OUTPUT0\" } output_map { key: \"OUTPUT1\" value: \"unused\" } "
            "} ] }\n")))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("configs")
    build(repo)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with running(repo) as server:
        yield server


def _check(*dirs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferd.cli", "check", *map(str, dirs)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


# -- inferd check ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def check_output(repo) -> dict[str, str]:
    proc = _check(repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = {}
    for line in proc.stdout.splitlines():
        name, sep, rest = line.partition(": ")
        if sep and (repo / name).is_dir():
            lines[name] = rest
    assert f"{len(GOOD)} of {len(GOOD) + len(BROKEN)} models ready" in proc.stdout
    return lines


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_check_reports_broken_model(check_output, name):
    line = check_output[name]
    assert line.startswith("UNAVAILABLE: "), line
    for word in BROKEN[name]:
        assert word in line, (word, line)


@pytest.mark.parametrize("name", GOOD)
def test_check_reports_good_model(check_output, name):
    assert check_output[name].startswith("READY"), check_output[name]


def test_check_exit_zero_when_all_good(tmp_path):
    add_model(tmp_path, "good", _add_sub(), config("good", INT16, OUT16, 8))
    add_model(tmp_path, "auto", _add_sub(), None)
    proc = _check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "good: READY" in proc.stdout and "auto: READY" in proc.stdout and "2 of 2 models ready" in proc.stdout


def _ensemble(repo, name: str, step_model: str, inputs=("INPUT0", "INPUT1"), output="OUTPUT0") -> None:  # type: ignore[no-untyped-def]
    maps = " ".join(f'input_map {{ key: "{i}" value: "A" }}' for i in inputs)
    add_model(repo, name, None, f'''name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "S" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step_model}" model_version: -1
  {maps} output_map {{ key: "{output}" value: "S" }} }} ] }}
''')
    (repo / name / "1").mkdir()


def test_check_loads_ensembles_as_serve_does(tmp_path):
    """Ensembles load after their composing models and are checked against them."""
    add_model(tmp_path, "good", _add_sub(), config("good", INT16, OUT16, 8))
    _ensemble(tmp_path, "ens", "good")
    _ensemble(tmp_path, "outer", "ens", inputs=("A",), output="S")  # nested
    proc = _check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["ens"] == "READY (versions 1; ensemble; max_batch_size 8)"
    assert lines["outer"] == "READY (versions 1; ensemble; max_batch_size 8)"
    assert "3 of 3 models ready" in proc.stdout

    _ensemble(tmp_path, "lost", "nope")  # names a model the repository lacks
    proc = _check(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["lost"] == ("UNAVAILABLE: ensemble lost contains models that are not available or ambiguous: "
                             "nope (ensemble 'lost' step 0 (model 'nope'): model 'nope' is not in the model "
                             "repository)")
    assert lines["ens"].startswith("READY") and "3 of 4 models ready" in proc.stdout


def test_check_missing_repository(tmp_path):
    proc = _check(tmp_path / "nowhere")
    assert proc.returncode == 1
    assert "nowhere" in proc.stdout and "does not exist" in proc.stdout


# -- the same through RepositoryIndex ----------------------------------------------------


def test_repository_index_reasons(client, check_output):
    index = {m.name: m for m in client.get_model_repository_index().models if m.state != "READY"}
    assert set(index) == set(BROKEN)
    for name, words in BROKEN.items():
        assert index[name].state == "UNAVAILABLE"
        for word in words:
            assert word in index[name].reason, (word, index[name].reason)
        # The server and `inferd check` give the same reason.
        assert check_output[name] == "UNAVAILABLE: " + index[name].reason
    ready = {m.name for m in client.get_model_repository_index().models if m.state == "READY"}
    assert ready == set(GOOD)


def _reasons(client) -> dict[str, str]:
    return {m.name: m.reason for m in client.get_model_repository_index().models}


def test_triton_refuses_reshape_that_contradicts_dims(client):
    reasons = _reasons(client)
    for name, reason in TRITON_RESHAPE.items():
        assert reasons[name] == reason


def test_triton_refuses_preserve_ordering_with_priorities_or_delay(client):
    reasons = _reasons(client)
    for name, reason in TRITON_ORDERING.items():
        assert reasons[name] == reason


def test_triton_refuses_a_control_tensor_for_two_kinds(client):
    assert _reasons(client)["control_tensor_multiple"] == TRITON_CONTROL["control_tensor_multiple"]


def test_a_broken_config_is_refused_for_itself_before_its_missing_folder(client, repo):
    assert not (repo / "priority_no_folder").joinpath("1").exists()
    assert _reasons(client)["priority_no_folder"] == TRITON_CONFIG_FIRST["priority_no_folder"]


def test_triton_refuses_an_ensemble_for_its_config_before_its_missing_folder(client, repo):
    assert not any(p.is_dir() for p in (repo / "redundant_tensor_as_output").iterdir())
    assert _reasons(client)["redundant_tensor_as_output"] == TRITON_ENSEMBLE["redundant_tensor_as_output"]


def test_broken_models_do_not_stop_the_others(client):
    x = np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(x)
        inputs.append(i)
    np.testing.assert_array_equal(client.infer("good", inputs).as_numpy("OUTPUT0"), 2 * x)


# -- auto-complete -----------------------------------------------------------------------


def test_autocomplete_batching_model(client):
    cfg = client.get_model_config("auto_batch").config
    assert cfg.name == "auto_batch"
    assert cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 4  # Triton's default for a model that can batch
    assert cfg.HasField("dynamic_batching")
    assert [(t.name, grpcclient.model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [(t.name, list(t.dims)) for t in cfg.output] == [("OUTPUT0", [16]), ("OUTPUT1", [16])]
    md = client.get_model_metadata("auto_batch")
    assert [list(t.shape) for t in md.inputs] == [[-1, 16], [-1, 16]]


def test_autocomplete_fixed_shape_model(client):
    cfg = client.get_model_config("auto_nobatch").config
    assert cfg.max_batch_size == 0
    assert not cfg.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in cfg.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    x = np.arange(16, dtype=np.int32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [16], "INT32")
        i.set_data_from_numpy(x)
        inputs.append(i)
    np.testing.assert_array_equal(client.infer("auto_nobatch", inputs).as_numpy("OUTPUT1"), 0 * x)


def test_autocomplete_scalar_per_row(client):
    """A model whose tensors are [batch]: Triton presents each as dims [1] reshaped to []."""
    cfg = client.get_model_config("auto_scalar").config
    assert cfg.max_batch_size == 4
    for t in list(cfg.input) + list(cfg.output):
        assert list(t.dims) == [1] and t.HasField("reshape") and list(t.reshape.shape) == []
    assert [list(t.shape) for t in client.get_model_metadata("auto_scalar").inputs] == [[-1, 1]]
    x = np.array([[1.5], [2.5], [-3.0]], dtype=np.float32)
    i = grpcclient.InferInput("INPUT0", [3, 1], "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("auto_scalar", [i])
    assert list(result.get_output("OUTPUT0").shape) == [3, 1]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


# -- version_policy, default_model_filename ----------------------------------------------


def _scale(client, model, version=""):
    i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    result = client.infer(model, [i], model_version=version)
    return float(result.as_numpy("OUTPUT0")[0, 0]), result.get_response().model_version


@pytest.mark.parametrize("model,loaded", [("v_latest", [2, 3]), ("v_all", [1, 2, 3]), ("v_specific", [1, 3])])
def test_version_policy(client, model, loaded):
    assert sorted(client.get_model_metadata(model).versions, key=int) == [str(v) for v in loaded]
    index = sorted((m.version, m.state) for m in client.get_model_repository_index().models if m.name == model)
    assert index == [(str(v), "READY") for v in loaded]
    assert _scale(client, model) == (float(max(loaded)), str(max(loaded)))  # default: the latest
    for v in (1, 2, 3):
        if v in loaded:
            assert client.is_model_ready(model, str(v))
            assert _scale(client, model, str(v)) == (float(v), str(v))
        else:
            assert not client.is_model_ready(model, str(v))
            with pytest.raises(InferenceServerException) as exc:
                _scale(client, model, str(v))
            assert exc.value.status() == "StatusCode.NOT_FOUND" and f"version {v}" in exc.value.message()
    stats = client.get_inference_statistics(model).model_stats
    assert sorted(s.version for s in stats) == sorted(str(v) for v in loaded)


def test_default_model_filename(client):
    assert client.get_model_config("custom_file").config.default_model_filename == "net.onnx"
    assert _scale(client, "custom_file") == (5.0, "1")


# -- reshape and optional inputs ---------------------------------------------------------


def test_reshape(client):
    md = client.get_model_metadata("reshaped")
    assert [list(t.shape) for t in md.inputs] == [[-1, 4]]
    assert [list(t.shape) for t in md.outputs] == [[-1, 4]]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    i = grpcclient.InferInput("INPUT0", [3, 4], "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("reshaped", [i])
    assert list(result.get_output("OUTPUT0").shape) == [3, 4]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    bad = grpcclient.InferInput("INPUT0", [1, 2, 2], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 2, 2), dtype=np.float32))
    with pytest.raises(InferenceServerException) as exc:
        client.infer("reshaped", [bad])
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "[-1, 4]" in exc.value.message()


def test_optional_input(client):
    cfg = client.get_model_config("optional_b").config
    assert [(t.name, t.optional) for t in cfg.input] == [("A", False), ("B", True)]
    a = grpcclient.InferInput("A", [4], "FP32")
    a.set_data_from_numpy(np.arange(4, dtype=np.float32))
    # Without B: the model's own default (10).
    np.testing.assert_array_equal(client.infer("optional_b", [a]).as_numpy("C"), [10, 11, 12, 13])
    b = grpcclient.InferInput("B", [4], "FP32")
    b.set_data_from_numpy(np.full(4, 100, dtype=np.float32))
    np.testing.assert_array_equal(client.infer("optional_b", [a, b]).as_numpy("C"), [100, 101, 102, 103])
    # A is not optional.
    with pytest.raises(InferenceServerException) as exc:
        client.infer("optional_b", [b])
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "'A'" in exc.value.message()


def test_reshape_keeping_variable_dimensions_in_place_is_accepted():
    """Triton's own example of a valid variable reshape: [2, 4, -1, 6] -> [8, -1, 1, 6]."""
    from inferd.config import check_declared, parse_config_text

    text = config("ok", [("INPUT", "TYPE_FP32", [2, 4, -1, 6])], FP32_1, 4,
                  input_extra={"INPUT": "reshape { shape: [ 8, -1, 1, 6 ] }"})
    check_declared(parse_config_text(text, model="ok"))  # raises on a refusal
    moved = text.replace("8, -1, 1, 6", "4, -1, 2, 6")
    with pytest.raises(ConfigError, match=r"reshape.shape \[4, -1, 2, 6\] and dims \[2, 4, -1, 6\] hold different"):
        check_declared(parse_config_text(moved, model="ok"))
