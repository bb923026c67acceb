"""Triton's example model repository (server repo, ``docs/examples/model_repository``),
built in code, so Triton's example clients (client repo, ``src/python/examples``) run
against inferd unmodified.

    python -m inferd.examples.triton_examples --output DIR [--with-repeat]

Same model names, tensor names, types, shapes and configs as Triton's; the files Triton
ships or downloads are replaced by equivalents built here:

- ``simple``, ``simple_int8``, ``simple_string``: ``OUTPUT0 = INPUT0 + INPUT1`` and
  ``OUTPUT1 = INPUT0 - INPUT1`` (the string model adds numbers written as text, as
  Triton's casts do);
- ``simple_sequence``: ``OUTPUT = READY * (INPUT + START)``; ``simple_dyna_sequence``
  adds ``END * CORRID`` (Triton's graphs compute the same);
- ``simple_identity``: a Python model returning INPUT0;
- ``densenet_onnx`` and ``inception_onnx``: Triton downloads trained image classifiers;
  here two small fixed-seed ONNX classifiers with the same inputs, outputs, formats,
  reshapes and label files (mean colour -> 1000 / 1001 class scores), enough for the
  image clients to preprocess, infer and print classes;
- ``repeat_int32`` (``--with-repeat``; not in Triton's repository, it is Triton's repeat
  backend example, which ``simple_grpc_custom_repeat.py`` calls): a decoupled Python model
  sending ``OUT = IN[i]`` after ``DELAY[i]`` ms for each element.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from . import onnx_models as om
from .build import ModelSpec, onnx_file, triton_config, write_model

SEED = 20240521
DENSENET_CLASSES = 1000
INCEPTION_CLASSES = 1001

_INT16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]


def _pair(data_type: str) -> tuple[list, list]:
    return ([("INPUT0", data_type, [16]), ("INPUT1", data_type, [16])],
            [("OUTPUT0", data_type, [16]), ("OUTPUT1", data_type, [16])])


def _add_sub_via(elem: int, compute: int = TensorProto.INT32):  # type: ignore[no-untyped-def]
    """INPUT0 +/- INPUT1 computed in ``compute``, cast back to ``elem`` (Triton's graphs)."""
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=compute),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=compute),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=elem),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=elem),
    ]
    io = [helper.make_tensor_value_info(n, elem, ["batch", 16]) for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    return om._model(helper.make_graph(nodes, "add_sub", io[:2], io[2:]))


def _sequence(dyna: bool):  # type: ignore[no-untyped-def]
    """READY * (INPUT + START [+ END * CORRID])."""
    i32 = TensorProto.INT32
    names = ["INPUT", "START"] + (["END"] if dyna else []) + ["READY"]
    inputs = [helper.make_tensor_value_info(n, i32, ["batch", 1]) for n in names]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["started"])]
    total = "started"
    if dyna:
        inputs.append(helper.make_tensor_value_info("CORRID", TensorProto.UINT64, ["batch", 1]))
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=i32),
            helper.make_node("Mul", ["END", "corrid"], ["ended"]),
            helper.make_node("Add", ["started", "ended"], ["total"]),
        ]
        total = "total"
    nodes.append(helper.make_node("Mul", ["READY", total], ["OUTPUT"]))
    output = helper.make_tensor_value_info("OUTPUT", i32, ["batch", 1])
    return om._model(helper.make_graph(nodes, "sequence", inputs, [output]))


def _classifier(input_name: str, shape: Sequence[int], pool_axes: Sequence[int], output_name: str,
                output_shape: Sequence[int], classes: int, seed: int):  # type: ignore[no-untyped-def]
    """Mean colour of the image -> class scores: a tiny stand-in for a trained classifier."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((3, classes)).astype(np.float32)
    bias = (rng.standard_normal(classes) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", [input_name], ["colour"], axes=list(pool_axes), keepdims=0),
        helper.make_node("MatMul", ["colour", "weights"], ["logits"]),
        helper.make_node("Add", ["logits", "bias"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probabilities"], axis=-1),
        helper.make_node("Reshape", ["probabilities", "output_shape"], [output_name]),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, list(output_shape))],
        initializer=[numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(bias, "bias"),
                     numpy_helper.from_array(np.array(output_shape, dtype=np.int64), "output_shape")],
    )
    return om._model(graph)


def _labels(prefix: str, count: int) -> bytes:
    return "".join(f"{prefix}_{i:04d}\n" for i in range(count)).encode()


def _image_model(name: str, input_name: str, fmt: str, dims: list[int], output_name: str, classes: int,
                 model_output: list[int], pool_axes: list[int], seed: int) -> ModelSpec:
    labels = f"{name.split('_')[0]}_labels.txt"
    config = (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        f'input [ {{ name: "{input_name}" data_type: TYPE_FP32 format: {fmt} dims: {dims} '
        f"reshape {{ shape: {[1, *dims]} }} }} ]\n"
        f'output [ {{ name: "{output_name}" data_type: TYPE_FP32 dims: [ {classes} ] '
        f'reshape {{ shape: {model_output} }} label_filename: "{labels}" }} ]\n'
    )
    return ModelSpec(name, config, {
        "1/model.onnx": onnx_file(lambda: _classifier(input_name, [1, *dims], pool_axes, output_name, model_output,
                                                      classes, seed)),
        labels: _labels(name.split("_")[0].upper(), classes),
    })


_START = '  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }'
_END = '  { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }'
_READY = '  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }'
_CORRID = '  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }'


def _controls(*controls: str) -> str:
    return "control_input [\n" + ",\n".join(controls) + "\n]\n"


_SEQ_IO = ([("INPUT", "TYPE_INT32", [1])], [("OUTPUT", "TYPE_INT32", [1])])

_IDENTITY_SOURCE = b'''"""simple_identity: OUTPUT0 is INPUT0 (TYPE_STRING, any length)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", text)]))
        return out
'''

_REPEAT_SOURCE = b'''"""repeat_int32: for each element i of IN, after DELAY[i] milliseconds, a response with
OUT = [IN[i]] and IDX = [i]; then the final flag. Responses come from a thread per
request, so execute returns at once and requests interleave."""

import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1).copy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1).copy()
            sender = request.get_response_sender()
            if delays.shape != values.shape:
                error = pb_utils.TritonError(
                    f"expected IN and DELAY shape to match, got {list(values.shape)} and {list(delays.shape)}",
                    pb_utils.TritonError.INVALID_ARG)
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                continue
            thread = threading.Thread(target=self._respond, args=(sender, values, delays), daemon=True)
            self._threads.append(thread)
            thread.start()
        return None

    def _respond(self, sender, values, delays):
        for i, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000.0)
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self._threads:
            thread.join(timeout=60)
'''


def models(with_repeat: bool = False) -> list[ModelSpec]:
    """Triton's eight example models (and ``repeat_int32`` when asked)."""
    out = [
        _image_model("densenet_onnx", "data_0", "FORMAT_NCHW", [3, 224, 224], "fc6_1", DENSENET_CLASSES,
                     [1, DENSENET_CLASSES, 1, 1], [2, 3], SEED),
        _image_model("inception_onnx", "input:0", "FORMAT_NHWC", [299, 299, 3],
                     "InceptionV3/Predictions/Softmax:0", INCEPTION_CLASSES, [1, INCEPTION_CLASSES], [1, 2], SEED + 1),
        ModelSpec("simple", triton_config("simple", *_pair("TYPE_INT32"), max_batch_size=8, instance_count=0),
                  {"1/model.onnx": onnx_file(lambda: om.add_sub(np.int32, 16, batch=True))}),
        ModelSpec("simple_int8", triton_config("simple_int8", *_pair("TYPE_INT8"), max_batch_size=8, instance_count=0),
                  {"1/model.onnx": onnx_file(lambda: _add_sub_via(TensorProto.INT8))}),
        ModelSpec("simple_string", triton_config("simple_string", *_pair("TYPE_STRING"), max_batch_size=8,
                                                 instance_count=0),
                  {"1/model.onnx": onnx_file(lambda: _add_sub_via(TensorProto.STRING))}),
        ModelSpec("simple_identity", triton_config(
            "simple_identity", [("INPUT0", "TYPE_STRING", [-1])], [("OUTPUT0", "TYPE_STRING", [-1])],
            max_batch_size=8, platform=None, backend="python", instance_count=0), {"1/model.py": _IDENTITY_SOURCE}),
        ModelSpec("simple_sequence", triton_config(
            "simple_sequence", *_SEQ_IO, max_batch_size=8, extra="sequence_batching {\n"
            + _controls(_START, _READY) + "}\n"),
            {"1/model.onnx": onnx_file(lambda: _sequence(dyna=False))}),
        ModelSpec("simple_dyna_sequence", triton_config(
            "simple_dyna_sequence", *_SEQ_IO, max_batch_size=8, instance_count=2, extra=(
                "sequence_batching {\n  max_sequence_idle_microseconds: 10000000\n"
                "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n"
                + _controls(_START, _END, _READY, _CORRID) + "}\n"
                'parameters [ { key: "execute_delay_ms" value: { string_value: "3" } } ]\n')),
            {"1/model.onnx": onnx_file(lambda: _sequence(dyna=True))}),
    ]
    if with_repeat:
        out.append(ModelSpec("repeat_int32", triton_config(
            "repeat_int32",
            [("IN", "TYPE_INT32", [-1]), ("DELAY", "TYPE_UINT32", [-1]), ("WAIT", "TYPE_UINT32", [1])],
            [("OUT", "TYPE_INT32", [1]), ("IDX", "TYPE_UINT32", [1])],
            platform=None, backend="python", extra="model_transaction_policy { decoupled: true }\n"),
            {"1/model.py": _REPEAT_SOURCE}))
    return out


def build(root: str | os.PathLike[str], with_repeat: bool = False, leave_out: Sequence[str] = ()) -> list[str]:
    """Write the repository under ``root`` (without the models in ``leave_out``); returns the names written."""
    names = []
    for spec in models(with_repeat):
        if spec.name in leave_out:
            continue
        write_model(spec, root)
        names.append(spec.name)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.examples.triton_examples",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="repository directory to write")
    parser.add_argument("--with-repeat", action="store_true", help="also write repeat_int32 (decoupled)")
    args = parser.parse_args(argv)
    for name in build(args.output, args.with_repeat):
        print(f"{name}: written under {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
