"""GPU-tuned configs load and serve everywhere: a repository written for GPUs in the spirit
of Triton's docs (the TensorRT execution accelerator with its parameters, CUDA graphs,
OpenVINO, custom histogram buckets, metric tags) serves on this CPU host, with one warning
line per model saying what was ignored and why; what maps onto onnxruntime's providers is
shown on made-up provider lists; what Triton refuses is refused in its words."""

from __future__ import annotations

import re
import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import running
from inferd.backends.onnxruntime import providers_for
from inferd.config import config_from_dict, parse_config_text
from inferd.config._optimization import histogram_buckets
from inferd.config._spec import model_spec
from inferd.config._validate import check_declared
from inferd.errors import ConfigError
from inferd.examples import onnx_models as om

ADD_SUB_IO = '''
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
'''
# name -> the GPU settings of its config (each an onnxruntime add_sub model).
TUNED = {
    "trt": '''optimization { execution_accelerators {
      gpu_execution_accelerator : [ { name : "tensorrt"
        parameters { key: "precision_mode" value: "FP16" }
        parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }''',
    "cuda_graphs": "optimization { cuda { graphs: true busy_wait_events: true output_copy_stream: true } }",
    "openvino": 'optimization { execution_accelerators { cpu_execution_accelerator : [ { name : "openvino" } ] } }',
    "bucketed": '''model_metrics { metric_control: [
      { metric_identifier: { family: "inferd_inference_request_duration_seconds" }
        histogram_options: { buckets: [ 0.5, 1, 2 ] } },
      { metric_identifier: { family: "nv_inference_request_success" } histogram_options: { buckets: [ 1 ] } } ] }
    metric_tags { key: "team" value: "search" }''',
}
PYTHON_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_tuned")
    for name, tuned in TUNED.items():
        (repo / name / "1").mkdir(parents=True)
        om.save(om.add_sub(), repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\n{ADD_SUB_IO}\n{textwrap.dedent(tuned)}\n')
    (repo / "py_graphs" / "1").mkdir(parents=True)
    (repo / "py_graphs" / "1" / "model.py").write_text(PYTHON_MODEL)
    (repo / "py_graphs" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\noptimization { cuda { graphs: true } }\n')
    with running(repo) as s:
        yield s


def _warnings(server, model: str) -> list[str]:
    return [line for line in server.log().splitlines()
            if f"model '{model}': ignored optimization settings" in line]


@pytest.mark.server
def test_every_gpu_tuned_model_loads_and_serves_on_cpu(server):
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(server.url) as client:
        for name in TUNED:
            assert client.is_model_ready(name), name
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(x)
            np.testing.assert_array_equal(client.infer(name, inputs).as_numpy("OUTPUT0"), 2 * x)
        assert client.is_model_ready("py_graphs")
        assert client.is_server_ready()


@pytest.mark.server
def test_one_warning_line_per_model_names_what_was_ignored_and_why(server):
    trt = _warnings(server, "trt")
    assert len(trt) == 1, server.log()
    assert ("optimization.execution_accelerators.gpu_execution_accelerator 'tensorrt' (no instance of this model "
            "runs on a GPU here)") in trt[0]
    graphs = _warnings(server, "cuda_graphs")
    assert len(graphs) == 1
    for field in ("graphs", "busy_wait_events", "output_copy_stream"):
        assert f"optimization.cuda.{field} (no instance of this model runs on a GPU here)" in graphs[0]
    openvino = _warnings(server, "openvino")
    assert len(openvino) == 1
    assert "cpu_execution_accelerator 'openvino' (this onnxruntime has no OpenVINOExecutionProvider)" in openvino[0]
    python = _warnings(server, "py_graphs")
    assert len(python) == 1 and "optimization.cuda.graphs (a Python model runs its own code" in python[0]
    assert _warnings(server, "bucketed") == []  # nothing GPU-specific asked
    assert ("model 'bucketed': model_metrics: Metric family 'nv_inference_request_success' in 'metric_identifier' "
            "is not a customizable metric in Triton core.") in server.log()


@pytest.mark.server
def test_custom_buckets_and_metric_tags_reach_metrics(server):
    x = np.zeros((1, 16), dtype=np.int32)
    with grpcclient.InferenceServerClient(server.url) as client:
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(x)
        client.infer("bucketed", inputs)
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    les = re.findall(r'inferd_inference_request_duration_seconds_bucket\{le="([^"]+)",model="bucketed",version="1"\}',
                     text)
    assert les == ["0.5", "1.0", "2.0", "+Inf"], les
    # (counts: this module's other tests infer too)
    assert re.search(r'^nv_inference_request_success\{model="bucketed",version="1",team="search"\} [1-9]', text, re.M)
    assert re.search(r'^nv_inference_request_success\{model="trt",version="1"\} ', text, re.M)  # untagged: unchanged
    default = re.findall(r'inferd_inference_request_duration_seconds_bucket\{le="[^"]+",model="trt",version="1"\}', text)
    assert len(default) == 19  # the default buckets and +Inf


# -- the mapping onto onnxruntime's providers, on made-up provider lists ---------------------


def _spec(tuned: str):  # type: ignore[no-untyped-def]
    config = parse_config_text(f'name: "m"\nbackend: "onnxruntime"\n{ADD_SUB_IO}\n{tuned}\n', model="m")
    check_declared(config)
    return model_spec(config, {})


GPU_HOST = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_tensorrt_accelerator_maps_onto_the_tensorrt_provider_with_its_parameters():
    providers, ignored = providers_for(_spec(TUNED["trt"]), "cuda", 1, GPU_HOST)
    assert providers == [
        ("TensorrtExecutionProvider", {"device_id": 1, "trt_fp16_enable": "True", "trt_max_workspace_size": "1073741824"}),
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert ignored == []


def test_tensorrt_missing_from_onnxruntime_is_warned_not_refused():
    providers, ignored = providers_for(_spec(TUNED["trt"]), "cuda", 0, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert providers == [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    assert ignored == [("optimization.execution_accelerators.gpu_execution_accelerator 'tensorrt'",
                        "this onnxruntime has no TensorrtExecutionProvider")]


def test_cuda_graphs_map_onto_the_cuda_provider_and_the_rest_is_warned():
    providers, ignored = providers_for(_spec(TUNED["cuda_graphs"]), "cuda", 0, GPU_HOST)
    assert providers == [("CUDAExecutionProvider", {"device_id": 0, "enable_cuda_graph": "1"}), "CPUExecutionProvider"]
    assert [f for f, _ in ignored] == ["optimization.cuda.busy_wait_events", "optimization.cuda.output_copy_stream"]


def test_cuda_accelerator_parameters_are_the_cuda_providers_options():
    tuned = ('optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "cuda" '
             'parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" } } ] } }')
    providers, ignored = providers_for(_spec(tuned), "cuda", 2, GPU_HOST)
    assert providers[0] == ("CUDAExecutionProvider", {"device_id": 2, "cudnn_conv_algo_search": "HEURISTIC"})
    assert ignored == []


def test_openvino_maps_onto_its_provider_where_onnxruntime_has_it():
    providers, ignored = providers_for(_spec(TUNED["openvino"]), "cpu", 0,
                                       ["OpenVINOExecutionProvider", "CPUExecutionProvider"])
    assert providers == [("OpenVINOExecutionProvider", {}), "CPUExecutionProvider"]
    assert ignored == []


# -- refused: what no Triton backend knows, and Triton's model_metrics errors --------------------


def test_an_unknown_accelerator_is_refused_with_the_known_ones():
    tuned = 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrtt" } ] } }'
    with pytest.raises(ConfigError) as info:
        _spec(tuned)
    assert info.value.message == (
        "model 'm': optimization.execution_accelerators.gpu_execution_accelerator 'tensorrtt' is not a GPU "
        "execution accelerator Triton knows; use one of ['tensorrt', 'cuda', 'auto_mixed_precision', 'gpu_io']")


@pytest.mark.parametrize("control,reason", [
    ({"histogram_options": {"buckets": [1]}}, "metric control must specify 'metric_identifier'"),
    ({"metric_identifier": {"family": ""}, "histogram_options": {"buckets": [1]}},
     "metric identifier must specify non-empty 'family'"),
    ({"metric_identifier": {"family": "inferd_inference_batch_size"}}, "metric control must specify 'histogram_options'"),
    ({"metric_identifier": {"family": "inferd_inference_batch_size"}, "histogram_options": {"buckets": []}},
     "histogram options must specify non-empty 'buckets'"),
    ({"metric_identifier": {"family": "inferd_inference_batch_size"}, "histogram_options": {"buckets": [4, 2]}},
     "histogram_options.buckets [4.0, 2.0] for family 'inferd_inference_batch_size' must be strictly increasing"),
])
def test_model_metrics_refused_in_tritons_words(control, reason):
    config = config_from_dict({"name": "m", "model_metrics": {"metric_control": [control]}})
    with pytest.raises(ConfigError) as info:
        histogram_buckets(config)
    assert info.value.message == f"model 'm': model_metrics.metric_control[0]: {reason}"


def test_metric_tags_may_not_take_the_servers_own_labels():
    with pytest.raises(ConfigError) as info:
        _spec('metric_tags { key: "version" value: "x" }')
    assert "metric_tags key 'version' is a label the server sets itself" in info.value.message
