"""Sequence and implicit-state models made the way Triton's QA makes its own
(qa/common/gen_qa_sequence_models.py, gen_qa_implicit_models.py), written here
from their semantics: ONNX graphs through onnx.helper, TorchScript through
torch.jit.trace / torch.jit.script (fixed seeds, no weights), int32 / fp32 /
string state, fixed and variable shapes, and Triton's ``<name>__<index>``
tensor names for TorchScript (the control and state inputs are forward()
arguments, supplied by the sequence batcher).

Each ``add_*`` writes ``repo/<name>/config.pbtxt`` and ``repo/<name>/1/<file>``.
What the models compute (the tests know it):

- ``sequence``: OUTPUT = (INPUT + START) * READY (QA's sequence model: not an
  accumulator; a filler row gives 0).
- ``implicit``: OUTPUT = OUTPUT_STATE = INPUT + STATE * (READY and not START), a
  running sum in implicit state (QA's model without initial_state); with
  ``initial``, OUTPUT = INPUT + STATE (QA's model with one: the start value is
  the initial state's).
- ``growing``: OUTPUT = OUTPUT_STATE = concat(STATE, INPUT) along the last
  dimension: a variable-size state that starts as one zero (or one empty
  string) and grows by each request's elements.
- ``controls`` (TorchScript): OUTPUT__0 = (INPUT + 10*START + 100*END) * READY,
  OUTPUT__1 = CORRID.
"""

from __future__ import annotations

import struct
import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from inferd.examples import onnx_models as om
from repo_builder import add_model

_ONNX = {"TYPE_INT32": TensorProto.INT32, "TYPE_FP32": TensorProto.FLOAT, "TYPE_STRING": TensorProto.STRING}
_CONTROL = {"TYPE_INT32": "int32", "TYPE_FP32": "fp32", "TYPE_STRING": "int32"}


def _dims(dims: list[int]) -> str:
    return "[ " + ", ".join(map(str, dims)) + " ]"


def _controls(names: dict[str, str], control_type: str) -> str:
    """``control_input`` for {kind: tensor name}; START/END/READY take [0, 1] of ``control_type``."""
    parts = []
    for kind, name in names.items():
        if kind == "CORRID":
            body = "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64"
        else:
            body = f"kind: CONTROL_SEQUENCE_{kind} {control_type}_false_true: [ 0, 1 ]"
        parts.append(f'{{ name: "{name}" control [ {{ {body} }} ] }}')
    return "control_input [\n  " + ",\n  ".join(parts) + "\n]\n"


def _state(input_name: str, output_name: str, data_type: str, dims: list[int], initial: str = "") -> str:
    """One ``state`` entry; ``initial``: "" (none), "zero", or a data file's name."""
    text = f'{{ input_name: "{input_name}" output_name: "{output_name}" data_type: {data_type} dims: {_dims(dims)}'
    if initial:
        start = [1 if d == -1 else d for d in dims]
        data = "zero_data: true" if initial == "zero" else f'data_file: "{initial}"'
        text += f' initial_state {{ name: "init" data_type: {data_type} dims: {_dims(start)} {data} }}'
    return "state [ " + text + " } ]\n"


def _config(name: str, platform: str, max_batch: int, inputs: list[tuple[str, str, list[int]]],
            outputs: list[tuple[str, str, list[int]]], sequence_body: str, instances: int = 1) -> str:
    def tensors(kind: str, items: list[tuple[str, str, list[int]]]) -> str:
        rows = [f'  {{ name: "{n}" data_type: {t} dims: {_dims(d)} }}' for n, t, d in items]
        return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"

    backend = 'backend: "python"\n' if platform == "python" else f'platform: "{platform}"\n'
    return (f'name: "{name}"\n{backend}max_batch_size: {max_batch}\n' + tensors("input", inputs)
            + tensors("output", outputs) + "sequence_batching {\n" + textwrap.indent(sequence_body, "  ") + "}\n"
            + f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n")


def _vi(name: str, etype: int, dims: list[int | str | None], batch: bool) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, etype, (["batch"] if batch else []) + list(dims))


# -- ONNX -------------------------------------------------------------------------------------------


def add_onnx_sequence(repo: Path, name: str, data_type: str = "TYPE_INT32", max_batch: int = 8,
                      strategy: str = "direct { }", idle_us: int = 5_000_000, instances: int = 1,
                      variable: bool = False) -> None:
    """QA's ONNX sequence model: OUTPUT = (INPUT + START) * READY, dims [1] (``variable``: INPUT and
    OUTPUT dims [-1], as in Triton's qa_variable_sequence_model_repository)."""
    et = _ONNX[data_type]
    batch = max_batch > 0
    data_dims: list[int | str | None] = ["n"] if variable else [1]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"])]
    graph = helper.make_graph(
        nodes, name, [_vi("INPUT", et, data_dims, batch)] + [_vi(n, et, [1], batch) for n in ("START", "READY")],
        [_vi("OUTPUT", et, data_dims, batch)])
    body = (f"max_sequence_idle_microseconds: {idle_us}\n{strategy}\n"
            + _controls({"START": "START", "READY": "READY"}, _CONTROL[data_type]))
    dims = [-1] if variable else [1]
    add_model(repo, name, om._model(graph), _config(
        name, "onnxruntime_onnx", max_batch, [("INPUT", data_type, dims)], [("OUTPUT", data_type, dims)], body,
        instances))


def add_onnx_implicit(repo: Path, name: str, data_type: str = "TYPE_INT32", max_batch: int = 8,
                      initial: str = "", initial_data: bytes | None = None, strategy: str = "direct { }") -> None:
    """QA's ONNX implicit-state model (a running sum), dims [1]; ``initial``: "", "zero" or a data
    file's name (written to ``initial_state/`` from ``initial_data``)."""
    et = _ONNX[data_type]
    batch = max_batch > 0
    control = TensorProto.FLOAT if data_type == "TYPE_FP32" else TensorProto.INT32
    if initial:
        nodes = [helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["sum"])]
    else:
        # STATE * (READY and not START): the state counts only inside a started sequence.
        nodes = [helper.make_node("Sub", ["READY", "START"], ["keep_c"]),
                 helper.make_node("Cast", ["keep_c"], ["keep"], to=et),
                 helper.make_node("Mul", ["INPUT_STATE", "keep"], ["kept"]),
                 helper.make_node("Add", ["INPUT", "kept"], ["sum"])]
    nodes += [helper.make_node("Identity", ["sum"], ["OUTPUT"]), helper.make_node("Identity", ["sum"], ["OUTPUT_STATE"])]
    graph = helper.make_graph(
        nodes, name,
        [_vi("INPUT_STATE", et, [1], batch), _vi("INPUT", et, [1], batch), _vi("START", control, [1], batch),
         _vi("READY", control, [1], batch)],
        [_vi("OUTPUT", et, [1], batch), _vi("OUTPUT_STATE", et, [1], batch)])
    body = (f"{strategy}\n" + _controls({"START": "START", "READY": "READY"}, _CONTROL[data_type])
            + _state("INPUT_STATE", "OUTPUT_STATE", data_type, [1], initial))
    model_dir = add_model(repo, name, om._model(graph), _config(
        name, "onnxruntime_onnx", max_batch, [("INPUT", data_type, [1])], [("OUTPUT", data_type, [1])], body))
    if initial_data is not None:
        (model_dir / "initial_state").mkdir(exist_ok=True)
        (model_dir / "initial_state" / initial).write_bytes(initial_data)


def add_onnx_growing(repo: Path, name: str, data_type: str = "TYPE_FP32", max_batch: int = 8,
                     initial: str = "") -> None:
    """A variable-size state [-1]: OUTPUT = OUTPUT_STATE = concat(INPUT_STATE, INPUT)."""
    et = _ONNX[data_type]
    batch = max_batch > 0
    nodes = [helper.make_node("Concat", ["INPUT_STATE", "INPUT"], ["cat"], axis=-1),
             helper.make_node("Identity", ["cat"], ["OUTPUT"]), helper.make_node("Identity", ["cat"], ["OUTPUT_STATE"])]
    graph = helper.make_graph(
        nodes, name,
        [_vi("INPUT", et, ["n"], batch), _vi("INPUT_STATE", et, ["s"], batch), _vi("START", TensorProto.INT32, [1], batch)],
        [_vi("OUTPUT", et, ["m"], batch), _vi("OUTPUT_STATE", et, ["m"], batch)])
    body = ("direct { }\n" + _controls({"START": "START"}, "int32")
            + _state("INPUT_STATE", "OUTPUT_STATE", data_type, [-1], initial))
    add_model(repo, name, om._model(graph), _config(
        name, "onnxruntime_onnx", max_batch, [("INPUT", data_type, [-1])], [("OUTPUT", data_type, [-1])], body))


def add_onnx_string_pair(repo: Path, name: str, max_batch: int = 8, data_file: bytes | None = None) -> None:
    """A fixed-size string state [1]: OUTPUT [2] = (the state, INPUT), OUTPUT_STATE = INPUT (the
    previous request's string; "" on START, or the data file's string)."""
    batch = max_batch > 0
    s = TensorProto.STRING
    nodes = [helper.make_node("Concat", ["INPUT_STATE", "INPUT"], ["OUTPUT"], axis=-1),
             helper.make_node("Identity", ["INPUT"], ["OUTPUT_STATE"])]
    graph = helper.make_graph(
        nodes, name, [_vi("INPUT", s, [1], batch), _vi("INPUT_STATE", s, [1], batch)],
        [_vi("OUTPUT", s, [2], batch), _vi("OUTPUT_STATE", s, [1], batch)])
    initial = "string_init" if data_file is not None else ""
    body = "oldest { max_candidate_sequences: 4 }\n" + _state("INPUT_STATE", "OUTPUT_STATE", "TYPE_STRING", [1],
                                                              initial)
    model_dir = add_model(repo, name, om._model(graph), _config(
        name, "onnxruntime_onnx", max_batch, [("INPUT", "TYPE_STRING", [1])], [("OUTPUT", "TYPE_STRING", [2])], body))
    if data_file is not None:
        (model_dir / "initial_state").mkdir(exist_ok=True)
        (model_dir / "initial_state" / initial).write_bytes(data_file)


def string_file(*items: bytes) -> bytes:
    """Strings as an initial_state data file holds them: Triton's length-prefixed wire form."""
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


# -- TorchScript -------------------------------------------------------------------------------------


def _save(repo: Path, name: str, module, config_text: str) -> None:  # type: ignore[no-untyped-def]
    import torch

    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    torch.jit.save(module, str(model_dir / "1" / "model.pt"))
    (model_dir / "config.pbtxt").write_text(config_text)


def add_torch_sequence(repo: Path, name: str, data_type: str = "TYPE_INT32", max_batch: int = 8) -> None:
    """QA's libtorch sequence model, traced: forward(input0, start0, ready0) = (input0 + start0) * ready0;
    INPUT__0, START__1, READY__2."""
    import torch

    torch.manual_seed(0)
    dtype = torch.int32 if data_type == "TYPE_INT32" else torch.float32

    class SequenceNet(torch.nn.Module):
        def forward(self, input0, start0, ready0):  # type: ignore[no-untyped-def]
            return (input0 + start0) * ready0

    shape = [1, 1] if max_batch > 0 else [1]
    example = tuple(torch.zeros(shape, dtype=dtype) for _ in range(3))
    traced = torch.jit.trace(SequenceNet(), example)
    body = "max_sequence_idle_microseconds: 5000000\n" + _controls(
        {"START": "START__1", "READY": "READY__2"}, _CONTROL[data_type])
    _save(repo, name, traced, _config(name, "pytorch_libtorch", max_batch, [("INPUT__0", data_type, [1])],
                                      [("OUTPUT__0", data_type, [1])], body))


def add_torch_controls(repo: Path, name: str, max_batch: int = 8) -> None:
    """Every control as a forward() argument: START__1, READY__2, END__3, CORRID__4 (TYPE_INT64)."""
    import torch

    class Controls(torch.nn.Module):
        def forward(self, input0: torch.Tensor, start0: torch.Tensor, ready0: torch.Tensor, end0: torch.Tensor,
                    corrid0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (input0 + 10 * start0 + 100 * end0) * ready0, corrid0

    body = _controls({"START": "START__1", "READY": "READY__2", "END": "END__3", "CORRID": "CORRID__4"}, "int32")
    _save(repo, name, torch.jit.script(Controls()), _config(
        name, "pytorch_libtorch", max_batch, [("INPUT__0", "TYPE_INT32", [1])],
        [("OUTPUT__0", "TYPE_INT32", [1]), ("OUTPUT__1", "TYPE_INT64", [1])], body))


def add_torch_implicit(repo: Path, name: str, data_type: str = "TYPE_INT32", max_batch: int = 8,
                       initial: str = "") -> None:
    """QA's libtorch implicit-state model, scripted: forward(input0, input0_state, start0, ready0);
    INPUT__0, INPUT_STATE__1, START__2, READY__3 -> OUTPUT__0, OUTPUT_STATE__1 (a running sum)."""
    import torch

    class SequenceNet(torch.nn.Module):
        def forward(self, input0: torch.Tensor, input0_state: torch.Tensor, start0: torch.Tensor,
                    ready0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            use_state = torch.logical_and(ready0 != 0, torch.logical_not(start0 != 0))
            result = (input0_state * use_state.to(input0_state.dtype)) + input0
            return result, result

    body = (_controls({"START": "START__2", "READY": "READY__3"}, _CONTROL[data_type])
            + _state("INPUT_STATE__1", "OUTPUT_STATE__1", data_type, [1], initial))
    _save(repo, name, torch.jit.script(SequenceNet()), _config(
        name, "pytorch_libtorch", max_batch, [("INPUT__0", data_type, [1])], [("OUTPUT__0", data_type, [1])], body))


def add_torch_growing(repo: Path, name: str, max_batch: int = 8) -> None:
    """A variable-size fp32 state [-1] in TorchScript: concat(state, input) along the last dimension."""
    import torch

    class Growing(torch.nn.Module):
        def forward(self, input0: torch.Tensor, input0_state: torch.Tensor,
                    start0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            grown = torch.cat([input0_state, input0], dim=-1)
            return grown, grown

    body = (_controls({"START": "START__2"}, "int32")
            + _state("INPUT_STATE__1", "OUTPUT_STATE__1", "TYPE_FP32", [-1]))
    _save(repo, name, torch.jit.script(Growing()), _config(
        name, "pytorch_libtorch", max_batch, [("INPUT__0", "TYPE_FP32", [-1])], [("OUTPUT__0", "TYPE_FP32", [-1])],
        body))


# -- Python ---------------------------------------------------------------------------------------------

_STRING_STATE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A string kept in implicit state: each request appends "|" and its INPUT."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0]
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy().reshape(-1)[0]
            joined = np.array([[bytes(state) + b"|" + bytes(x)]], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", joined), pb_utils.Tensor("STATE_OUT", joined)]))
        return responses
'''


def add_python_string_state(repo: Path, name: str) -> None:
    body = "direct { }\n" + _state("STATE_IN", "STATE_OUT", "TYPE_STRING", [1])
    add_model(repo, name, _STRING_STATE_PY.encode(), _config(
        name, "python", 4, [("INPUT", "TYPE_STRING", [1])], [("OUTPUT", "TYPE_STRING", [1])], body),
        filename="model.py")


_REVERSE_PY = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = {gate!r}
GROUP = {group!r}
LAST = {last!r}


def _wait(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)


class TritonPythonModel:
    """Request i (INPUT0 = i) finishes only after request i + 1 of its group of GROUP has finished:
    within each group, executions end in reverse order of arrival."""

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            i = int(x.reshape(-1)[0])
            if i % GROUP != GROUP - 1 and i != LAST:
                _wait(os.path.join(GATE, "done.%d" % (i + 1)))
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
            open(os.path.join(GATE, "done.%d" % i), "w").close()
        return out
'''


def add_reverse_finisher(repo: Path, name: str, gate: Path, group: int, last: int) -> None:
    """INPUT0 -> OUTPUT0 (FP32 [1], max_batch_size 0) on ``group`` instances; see ``_REVERSE_PY``."""
    gate.mkdir(parents=True, exist_ok=True)
    text = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            f"instance_group [ {{ kind: KIND_CPU count: {group} }} ]\n")
    add_model(repo, name, _REVERSE_PY.format(gate=str(gate), group=group, last=last).encode(), text,
              filename="model.py")


def int32_file(*values: int) -> bytes:
    return np.array(values, dtype="<i4").tobytes()
