"""Issue 47 item 4: Triton's nv_inference_first_response_histogram_ms behind --metrics-config
histogram_latencies=true (off by default): one observation per request for every model, decoupled or not,
ensembles too, in whole milliseconds, Triton's default buckets or a model's own (model_metrics)."""

from __future__ import annotations

import re
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.examples import onnx_models as om
from inferd.examples.build import ensemble_steps

FAMILY = "nv_inference_first_response_histogram_ms"
REPEAT = Path(__file__).resolve().parent.parent / "inferd" / "examples" / "python_models" / "repeat_decoupled.py"
IO = ([("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])])
CUSTOM = ('model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" } '
          'histogram_options { buckets: [ 1, 2.5, 8 ] } } ] }\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    from conftest import running
    from repo_builder import add_model, config

    repo = tmp_path_factory.mktemp("first_response")
    add_model(repo, "plain", om.identity(np.float32, [-1], batch=False), config("plain", *IO, 0))
    add_model(repo, "custom", om.identity(np.float32, [-1], batch=False), config("custom", *IO, 0, extra=CUSTOM))
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(config("chain", *IO, 0, platform="ensemble", extra=ensemble_steps([
        ("plain", {"INPUT0": "INPUT0"}, {"OUTPUT0": "mid"}), ("plain", {"INPUT0": "mid"}, {"OUTPUT0": "OUTPUT0"})])))
    (repo / "repeat" / "1").mkdir(parents=True)
    shutil.copy(REPEAT, repo / "repeat" / "1" / "model.py")
    (repo / "repeat" / "config.pbtxt").write_text(
        'name: "repeat"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "REPEAT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n'
        "model_transaction_policy { decoupled: true }\n")
    with running(repo, extra_args=["--metrics-config", "histogram_latencies=true"]) as s:
        yield s


def _series(server) -> dict[str, float]:  # type: ignore[no-untyped-def]
    text = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^({FAMILY}\S*) (\S+)$", text, re.M)}


def _infer(client, model: str) -> None:  # type: ignore[no-untyped-def]
    x = grpcclient.InferInput("INPUT0", [2], "FP32").set_data_from_numpy(np.ones(2, np.float32))
    client.infer(model, [x])


def test_one_observation_per_request_for_every_model(server) -> None:  # type: ignore[no-untyped-def]
    import queue

    before = _series(server)
    for model in ("plain", "custom", "chain"):
        assert before[f'{FAMILY}_count{{model="{model}",version="1"}}'] == 0  # there from the load, as Triton's
    with grpcclient.InferenceServerClient(server.url) as client:
        for _ in range(3):
            _infer(client, "plain")
        _infer(client, "custom")
        _infer(client, "chain")  # its own request, and one for each of its two steps on 'plain'
        got: queue.Queue = queue.Queue()
        client.start_stream(lambda result, error: got.put(error or result))
        for repeat in (3, 0):  # three responses, then none (the final flag alone): one observation each
            inputs = [grpcclient.InferInput("IN", [1], "INT32").set_data_from_numpy(np.array([7], np.int32)),
                      grpcclient.InferInput("REPEAT", [1], "INT32").set_data_from_numpy(np.array([repeat], np.int32))]
            client.async_stream_infer("repeat", inputs, enable_empty_final_response=True)
        finals = 0
        while finals < 2:
            item = got.get(timeout=60)
            assert not isinstance(item, Exception), item
            finals += item.get_response().parameters["triton_final_response"].bool_param
        client.stop_stream()
    series = _series(server)

    def count(model: str) -> float:
        return series[f'{FAMILY}_count{{model="{model}",version="1"}}']

    assert {m: count(m) for m in ("plain", "custom", "chain", "repeat")} == {"plain": 5, "custom": 1, "chain": 1,
                                                                            "repeat": 2}
    labels = 'model="plain",version="1"'
    assert [series[f'{FAMILY}_bucket{{{labels},le="{le}"}}'] for le in ("100", "500", "2000", "5000", "+Inf")] \
        == [5, 5, 5, 5, 5]  # an identity answers within 100 ms, even on a busy machine
    assert series[f"{FAMILY}_sum{{{labels}}}"] == int(series[f"{FAMILY}_sum{{{labels}}}"])  # whole milliseconds
    custom = 'model="custom",version="1"'
    assert [k for k in series if k.startswith(f"{FAMILY}_bucket{{{custom}")] == [
        f'{FAMILY}_bucket{{{custom},le="{le}"}}' for le in ("1", "2.5", "8", "+Inf")]


def test_off_by_default(example_server) -> None:  # type: ignore[no-untyped-def]
    text = urllib.request.urlopen(example_server.metrics_url, timeout=30).read().decode()
    assert FAMILY not in text
