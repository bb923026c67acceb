"""Variable-length batching end to end: tritonclient (gRPC, asyncio) against a real ``inferd serve``.

- the example text encoder (ONNX and TorchScript, padding + buckets): requests of mixed
  lengths share executions and each gets what it gets alone, unpadded (within 1e-5);
- a probe model that returns what the model saw (its padded input, the mask and lengths
  inferd filled, the batch's shape): masks and lengths are right, buckets never mix,
  the element budget holds, outputs are cut back, the padding waste is exported;
- Triton's ragged batching on models like Triton's own qa/L0_batch_input ones: each batch
  input kind and the scattered batch output give exactly the values Triton's test expects.

Each scenario has its own model, so statistics never mix. Models that must see requests
together wait up to QUEUE_DELAY_US for company; each test sends all of its requests at once.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc.aio as aioclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, running
from inferd.examples import build
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

QUEUE_DELAY_US = 300_000


def params(values: dict[str, object]) -> str:
    return build.parameters(values)


def batching(delay_us: int = QUEUE_DELAY_US) -> str:
    return f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"


# -- models --------------------------------------------------------------------------------


def probe_model() -> onnx.ModelProto:
    """X (FP32 [b, l]) -> X_OUT and X_FULL (X itself), MASK_OUT, LEN_OUT (what inferd filled)
    and SHAPE_OUT ([b, 2]: the executed batch's rows and padded length, on every row)."""
    f, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    nodes = [
        helper.make_node("Identity", ["X"], ["X_OUT"]),
        helper.make_node("Identity", ["X"], ["X_FULL"]),
        helper.make_node("Identity", ["MASK"], ["MASK_OUT"]),
        helper.make_node("Identity", ["LEN"], ["LEN_OUT"]),
        helper.make_node("Shape", ["X"], ["shape"]),
        helper.make_node("Unsqueeze", ["shape", "zero"], ["shape_row"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
        helper.make_node("Concat", ["rows", "two"], ["target"], axis=0),
        helper.make_node("Expand", ["shape_row", "target"], ["SHAPE_OUT"]),
    ]
    consts = [helper.make_tensor(n, i64, [1], [v]) for n, v in (("zero", 0), ("one", 1), ("two", 2))]
    graph = helper.make_graph(
        nodes, "probe",
        [helper.make_tensor_value_info("X", f, ["b", "l"]), helper.make_tensor_value_info("MASK", i32, ["b", "l"]),
         helper.make_tensor_value_info("LEN", i64, ["b", 1])],
        [helper.make_tensor_value_info("X_OUT", f, ["b", "l"]), helper.make_tensor_value_info("X_FULL", f, ["b", "l"]),
         helper.make_tensor_value_info("MASK_OUT", i32, ["b", "l"]),
         helper.make_tensor_value_info("LEN_OUT", i64, ["b", 1]),
         helper.make_tensor_value_info("SHAPE_OUT", i64, ["b", 2])],
        initializer=consts,
    )
    return om._model(graph)


def probe_config(name: str, extra: dict[str, object] | None = None, max_batch_size: int = 8) -> str:
    values: dict[str, object] = {"inferd.padding": "true", "inferd.pad_value": "-1", "inferd.mask_input": "MASK",
                                 "inferd.lengths_input": "LEN",
                                 "inferd.unpad_outputs": "X_FULL:none,MASK_OUT:none", **(extra or {})}
    return config(name, [("X", "TYPE_FP32", [-1]), ("MASK", "TYPE_INT32", [-1]), ("LEN", "TYPE_INT64", [1])],
                  [("X_OUT", "TYPE_FP32", [-1]), ("X_FULL", "TYPE_FP32", [-1]), ("MASK_OUT", "TYPE_INT32", [-1]),
                   ("LEN_OUT", "TYPE_INT64", [1]), ("SHAPE_OUT", "TYPE_INT64", [2])],
                  max_batch_size=max_batch_size, extra=batching() + params(values))


def ragged_batch_input_model() -> onnx.ModelProto:
    """Triton's qa 'batch_input' identity model: each 1-D input times a [requests, 1] column
    of ones (from BATCH_AND_SIZE_INPUT / itself), so every request gets the whole tensor."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Div", ["BATCH_AND_SIZE_INPUT", "BATCH_AND_SIZE_INPUT"], ["ones"]),
        helper.make_node("Reshape", ["ones", "column"], ["expander"]),
    ]
    outputs = []
    for name in ("RAGGED", "BATCH_AND_SIZE", "BATCH"):
        nodes += [helper.make_node("Reshape", [f"{name}_INPUT", "row"], [f"{name}_row"]),
                  helper.make_node("MatMul", ["expander", f"{name}_row"], [f"{name}_OUTPUT"])]
        outputs.append(helper.make_tensor_value_info(f"{name}_OUTPUT", f, ["r", "n"]))
    graph = helper.make_graph(
        nodes, "batch_input",
        [helper.make_tensor_value_info(n, f, [f"d{i}"]) for i, n in
         enumerate(("RAGGED_INPUT", "BATCH_AND_SIZE_INPUT", "BATCH_INPUT"))],
        outputs,
        initializer=[helper.make_tensor("row", TensorProto.INT64, [2], [1, -1]),
                     helper.make_tensor("column", TensorProto.INT64, [2], [-1, 1])],
    )
    return om._model(graph)


def ragged_batch_item_model() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Identity", ["BATCH_INPUT"], ["BATCH_OUTPUT"])], "batch_item",
        [helper.make_tensor_value_info("RAGGED_INPUT", f, ["n"]), helper.make_tensor_value_info("BATCH_INPUT", f, ["b", 2])],
        [helper.make_tensor_value_info("BATCH_OUTPUT", f, ["b", 2])],
    )
    return om._model(graph)


def ragged_config(name: str, batch_inputs: list[tuple[str, str]], ragged_dims: str = "-1") -> str:
    outs = "".join(f'output [ {{ name: "{n}" data_type: TYPE_FP32 dims: [ -1 ] }} ]\n'
                   for n in ("RAGGED_OUTPUT", "BATCH_AND_SIZE_OUTPUT", "BATCH_OUTPUT"))
    bis = ", ".join(f'{{ kind: {kind} target_name: "{target}" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }}'
                    for kind, target in batch_inputs)
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
            f'input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ {ragged_dims} ] allow_ragged_batch: true }} ]\n'
            + outs + f"batch_input [ {bis} ]\n" + batching(1_000_000))


ELEMENT_COUNT_ACC_ZERO = [("BATCH_ELEMENT_COUNT", "BATCH_AND_SIZE_INPUT"),
                          ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_INPUT")]
ACC_SHAPE = [("BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_AND_SIZE_INPUT"),
             ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "BATCH_INPUT")]
ITEM_FLATTEN = [("BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_AND_SIZE_INPUT"), ("BATCH_ITEM_SHAPE_FLATTEN", "BATCH_INPUT")]

ENCODER_TEST_PADDING = {**build.ENCODER_PADDING}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from inferd.examples import encoder

    repo = Path(tmp_path_factory.mktemp("varlen_repo"))
    onnx_file, torch_file = encoder.onnx_bytes(), encoder.torchscript_bytes()
    delay = f"max_queue_delay_microseconds: {QUEUE_DELAY_US}"
    for name, platform, filename, data in (("enc", "onnxruntime_onnx", "model.onnx", onnx_file),
                                           ("enc_torch", "pytorch_libtorch", "model.pt", torch_file)):
        add_model(repo, name, data, build.encoder_config(name, platform, ENCODER_TEST_PADDING, delay),
                  filename=filename)
        # The reference: the same file, no padding, no batching; the client sends the mask.
        add_model(repo, f"{name}_ref", data, build.encoder_config(f"{name}_ref", platform, None, None),
                  filename=filename)
    probe = probe_model()
    add_model(repo, "probe", probe, probe_config("probe"))
    add_model(repo, "probe_waste", probe, probe_config("probe_waste"))
    add_model(repo, "probe_waste_hosted", probe, probe_config("probe_waste_hosted", {"inferd.host": "process"}))
    add_model(repo, "probe_buckets", probe, probe_config("probe_buckets", {"inferd.length_buckets": "4,8,16"}))
    add_model(repo, "probe_budget", probe, probe_config("probe_budget", {"inferd.max_batch_elements": 20}))
    batch_input = ragged_batch_input_model()
    add_model(repo, "ragged_element_count_acc_zero", batch_input,
              ragged_config("ragged_element_count_acc_zero", ELEMENT_COUNT_ACC_ZERO))
    add_model(repo, "ragged_acc_shape", batch_input, ragged_config("ragged_acc_shape", ACC_SHAPE))
    add_model(repo, "batch_item_flatten", batch_input, ragged_config("batch_item_flatten", ITEM_FLATTEN, "-1, -1"))
    add_model(repo, "batch_item", ragged_batch_item_model(), (
        'name: "batch_item"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]\n'
        'output [ { name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "BATCH_INPUT" data_type: TYPE_FP32 '
        'source_input: "RAGGED_INPUT" } ]\n' + batching(1_000_000)))
    add_model(repo, "ragged_io", om.identity(np.float32, [-1], batch=False), (
        'name: "ragged_io"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" } ]\n'
        + batching(1_000_000)))
    with running(repo) as srv:
        yield srv


def tensor(name: str, array: np.ndarray, datatype: str) -> aioclient.InferInput:
    i = aioclient.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


async def infer_all(client, model: str, requests: list[list[aioclient.InferInput]]):  # type: ignore[no-untyped-def]
    return await asyncio.gather(*(client.infer(model, inputs) for inputs in requests))


async def counts(client, model: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    stats = (await client.get_inference_statistics(model, as_json=True))["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


# -- the example encoder ------------------------------------------------------------------------------

LENGTHS = [3, 5, 9, 16, 17, 30, 31, 40, 64, 65, 100, 200]


@pytest.mark.parametrize("model", ["enc", "enc_torch"])
async def test_mixed_lengths_share_executions_and_match_running_alone(aio_client, model):
    rng = np.random.default_rng(7)
    sequences = [rng.integers(1, 1000, (1, n), dtype=np.int64) for n in LENGTHS]
    alone = [(await aio_client.infer(f"{model}_ref", [tensor("INPUT_IDS", s, "INT64"),
                                                  tensor("ATTENTION_MASK", np.ones_like(s), "INT64")]))
             .as_numpy("EMBEDDING") for s in sequences]
    together = await infer_all(aio_client, model, [[tensor("INPUT_IDS", s, "INT64")] for s in sequences])
    for n, ref, result in zip(LENGTHS, alone, together):
        got = result.as_numpy("EMBEDDING")
        assert got.shape == (1, 64)
        assert np.abs(got - ref).max() <= 1e-5, f"length {n}"
    inferences, executions = await counts(aio_client, model)
    assert inferences == len(LENGTHS)
    assert executions < inferences  # 12 lengths over 5 buckets: 5 executions when all arrive together


async def test_a_client_written_for_triton_may_still_send_the_mask(aio_client):
    config = (await aio_client.get_model_config("enc", as_json=True))["config"]
    assert [(i["name"], i.get("optional", False)) for i in config["input"]] == [
        ("INPUT_IDS", False), ("ATTENTION_MASK", True)]
    rng = np.random.default_rng(8)
    sequences = [rng.integers(1, 1000, (1, n), dtype=np.int64) for n in (4, 11, 13)]
    masked = [[tensor("INPUT_IDS", s, "INT64"), tensor("ATTENTION_MASK", np.ones_like(s), "INT64")]
              for s in sequences]
    alone = [(await aio_client.infer("enc_ref", inputs)).as_numpy("EMBEDDING") for inputs in masked]
    together = await infer_all(aio_client, "enc", masked)  # one bucket: padded together, their masks with 0
    for ref, result in zip(alone, together):
        assert np.abs(result.as_numpy("EMBEDDING") - ref).max() <= 1e-5


async def test_a_request_longer_than_the_last_bucket_is_refused(aio_client):
    with pytest.raises(InferenceServerException, match="length 513, longer than the last of "
                                                       "inferd.length_buckets \\(512\\)") as info:
        await aio_client.infer("enc", [tensor("INPUT_IDS", np.ones((1, 513), np.int64), "INT64")])
    assert "INVALID_ARGUMENT" in str(info.value.status())


# -- what the model sees ---------------------------------------------------------------------------


def probe_request(length: int, rows: int = 1) -> tuple[np.ndarray, list[aioclient.InferInput]]:
    x = (np.arange(rows * length, dtype=np.float32).reshape(rows, length) + 1) * (length + 1)
    return x, [tensor("X", x, "FP32")]


async def test_padding_mask_and_lengths_are_what_the_model_sees(aio_client):
    lengths = [2, 5, 3]
    requests = [probe_request(n, rows=2 if n == 3 else 1) for n in lengths]
    results = await infer_all(aio_client, "probe", [r[1] for r in requests])
    for n, (x, _), result in zip(lengths, requests, results):
        rows = x.shape[0]
        assert result.as_numpy("SHAPE_OUT").tolist() == [[4, 5]] * rows  # one batch: 1 + 1 + 2 rows, 5 long
        assert np.array_equal(result.as_numpy("X_OUT"), x)  # cut back to its own length
        full = np.full((rows, 5), -1, np.float32)
        full[:, :n] = x
        assert np.array_equal(result.as_numpy("X_FULL"), full)  # padded with inferd.pad_value
        assert result.as_numpy("MASK_OUT").tolist() == [[1] * n + [0] * (5 - n)] * rows
        assert result.as_numpy("MASK_OUT").dtype == np.int32
        assert result.as_numpy("LEN_OUT").tolist() == [[n]] * rows


async def test_buckets_never_mix(aio_client):
    lengths = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 3, 6, 10]
    results = await infer_all(aio_client, "probe_buckets", [probe_request(n)[1] for n in lengths])
    bounds = [4, 8, 16]
    rows_seen: dict[int, int] = {}
    for n, result in zip(lengths, results):
        rows, padded = result.as_numpy("SHAPE_OUT")[0].tolist()
        bucket = next(i for i, b in enumerate(bounds) if n <= b)
        # padded to its batch's longest, which is in its own bucket: no longer request, no shorter bucket
        assert n <= padded <= bounds[bucket] and (bucket == 0 or padded > bounds[bucket - 1]), (n, padded)
        rows_seen[bucket] = rows
    assert rows_seen == {0: 5, 1: 5, 2: 4}  # each bucket was one batch of all its requests
    assert await counts(aio_client, "probe_buckets") == (len(lengths), 3)


async def test_the_budget_holds(aio_client):
    lengths = [2, 2, 2, 3, 5, 5, 9, 10]
    results = await infer_all(aio_client, "probe_budget", [probe_request(n)[1] for n in lengths])
    for n, result in zip(lengths, results):
        rows, padded = result.as_numpy("SHAPE_OUT")[0].tolist()
        assert rows * padded <= 20 and padded >= n
        assert np.array_equal(result.as_numpy("X_OUT"), probe_request(n)[0])
    inferences, executions = await counts(aio_client, "probe_budget")
    assert inferences == len(lengths) and 1 < executions < len(lengths)
    with pytest.raises(InferenceServerException, match="exceed inferd.max_batch_elements \\(20\\)"):
        await aio_client.infer("probe_budget", probe_request(7, rows=3)[1])


@pytest.mark.parametrize("model", ["probe_waste", "probe_waste_hosted"])  # padded in the core, in a model host
async def test_padding_waste_is_exported(aio_client, server, model: str):
    await infer_all(aio_client, model, [probe_request(n)[1] for n in (2, 6)])  # one batch: 8 real, 4 pad
    text = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()

    def value(metric: str) -> float:
        m = re.search(rf'^{metric}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        assert m, (metric, text)
        return float(m.group(1))

    assert value("inferd_inference_real_elements_total") == 8
    assert value("inferd_inference_pad_elements_total") == 4
    assert value("inferd_inference_padding_waste") == 0.5


# -- Triton's ragged batching ------------------------------------------------------------------------


def stream(server: ServerProcess, model: str, shapes: list[list[int]], name: str = "RAGGED_INPUT") -> list:
    """As Triton's batch_input_test.py: one request per shape, filled with its first non-batch
    extent, sent on one stream (so they queue in order); the results in the order sent."""
    import queue

    import tritonclient.grpc as grpcclient

    done: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url)
    c.start_stream(callback=lambda result, error: done.put(error or result))
    try:
        for i, s in enumerate(shapes):
            inp = grpcclient.InferInput(name, s, "FP32")
            inp.set_data_from_numpy(np.full(s, s[1], np.float32))
            c.async_stream_infer(model, [inp], request_id=str(i))
        results = [done.get(timeout=60) for _ in shapes]
    finally:
        c.stop_stream()
        c.close()
    for r in results:
        if isinstance(r, Exception):
            raise r
    return sorted(results, key=lambda r: int(r.get_response().id))


FOUR = [[1, 2], [1, 4], [1, 1], [1, 3]]


@pytest.mark.parametrize(("model", "output", "expected"), [
    ("ragged_element_count_acc_zero", "BATCH_AND_SIZE_OUTPUT", [[2, 4, 1, 3]]),  # BATCH_ELEMENT_COUNT
    ("ragged_acc_shape", "BATCH_AND_SIZE_OUTPUT", [[2, 6, 7, 10]]),  # BATCH_ACCUMULATED_ELEMENT_COUNT
    ("ragged_element_count_acc_zero", "BATCH_OUTPUT", [[0, 2, 6, 7, 10]]),  # ..._WITH_ZERO
    ("ragged_acc_shape", "RAGGED_OUTPUT", [[2, 2, 4, 4, 4, 4, 1, 3, 3, 3]]),  # the ragged input, concatenated
])
def test_batch_input_kinds_give_tritons_values(server, model, output, expected):
    for result in stream(server, model, FOUR):
        assert result.as_numpy(output).tolist() == expected


def test_max_element_count_as_shape(server):
    assert [r.as_numpy("BATCH_OUTPUT").shape for r in stream(server, "ragged_acc_shape", FOUR)] == [(1, 4)] * 4


def test_batch_item_shape_flatten(server):
    for result in stream(server, "batch_item_flatten", [[1, 4, 1], [1, 1, 2], [1, 1, 2], [1, 2, 2]]):
        assert result.as_numpy("BATCH_OUTPUT").tolist() == [[4, 1, 1, 2, 1, 2, 2, 2]]


async def test_batch_item_shape(server, aio_client):
    results = await asyncio.to_thread(stream, server, "batch_item", [[2, 1, 2], [1, 1, 2], [1, 2, 2]])
    assert [r.as_numpy("BATCH_OUTPUT").tolist() for r in results] == [[[1, 2], [1, 2]], [[1, 2]], [[2, 2]]]
    assert await counts(aio_client, "batch_item") == (4, 1)


async def test_batch_output_scatters_by_each_requests_input_shape(server, aio_client):
    results = await asyncio.to_thread(stream, server, "ragged_io", FOUR, "INPUT0")
    assert [r.as_numpy("OUTPUT0").tolist() for r in results] == [[[2] * 2], [[4] * 4], [[1]], [[3] * 3]]
    assert await counts(aio_client, "ragged_io") == (4, 1)
