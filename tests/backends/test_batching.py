"""Joining padded and ragged batches and splitting their outputs (inferd.backends.batching):
plain numpy in, numpy out, specs parsed from config text as a model's would be."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.backends.batching import join, split
from inferd.config import VarlenSpec, parse_config_text, varlen_spec
from inferd.errors import ModelExecutionError


def spec(body: str, params: dict[str, str] | None = None) -> VarlenSpec:
    text = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + body
    for key, value in (params or {}).items():
        text += f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
    result = varlen_spec(parse_config_text(text, model="m"))
    assert result is not None
    return result


TEXT = """input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] },
          { name: "MASK" data_type: TYPE_INT64 dims: [ -1 ] },
          { name: "LENGTHS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOKENS" data_type: TYPE_FP32 dims: [ -1, 4 ] },
         { name: "POOLED" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
TEXT_PADDING = {"inferd.padding": "true", "inferd.mask_input": "MASK", "inferd.lengths_input": "LENGTHS",
                "inferd.pad_value": "IDS:7"}


def ids(*rows: list[int]) -> dict[str, np.ndarray]:
    return {"IDS": np.array(rows, dtype=np.int64)}


def test_padding_fills_pad_value_mask_and_lengths():
    joined = join([ids([1, 2]), ids([3, 4, 5, 6]), ids([8], [9])], spec(TEXT, TEXT_PADDING))
    assert joined.inputs["IDS"].tolist() == [[1, 2, 7, 7], [3, 4, 5, 6], [8, 7, 7, 7], [9, 7, 7, 7]]
    assert joined.inputs["MASK"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]]
    assert joined.inputs["MASK"].dtype == np.int64
    assert joined.inputs["LENGTHS"].tolist() == [[2], [4], [1], [1]]
    assert joined.inputs["LENGTHS"].dtype == np.int32
    assert joined.rows == [1, 1, 2]
    assert (joined.real_elements, joined.pad_elements) == (8, 8)


def test_a_batch_of_equal_lengths_needs_no_padding_but_still_gets_mask_and_lengths():
    joined = join([ids([1, 2, 3]), ids([4, 5, 6])], spec(TEXT, TEXT_PADDING))
    assert joined.inputs["IDS"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert joined.inputs["MASK"].tolist() == [[1, 1, 1], [1, 1, 1]]
    assert (joined.real_elements, joined.pad_elements) == (6, 0)


def test_outputs_are_cut_back_to_each_requests_length_and_pooled_ones_are_left_alone():
    varlen = spec(TEXT, TEXT_PADDING)
    joined = join([ids([1, 2]), ids([3, 4, 5])], varlen)
    tokens = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    pooled = np.arange(8, dtype=np.float32).reshape(2, 4)
    first, second = split("m", joined, {"TOKENS": tokens, "POOLED": pooled}, varlen)
    assert first["TOKENS"].shape == (1, 2, 4) and np.array_equal(first["TOKENS"][0], tokens[0, :2])
    assert second["TOKENS"].shape == (1, 3, 4) and np.array_equal(second["TOKENS"][0], tokens[1])
    assert np.array_equal(first["POOLED"], pooled[:1]) and np.array_equal(second["POOLED"], pooled[1:])


def test_unpad_outputs_none_returns_the_padded_output():
    varlen = spec(TEXT, {**TEXT_PADDING, "inferd.unpad_outputs": "TOKENS:none"})
    joined = join([ids([1, 2]), ids([3, 4, 5])], varlen)
    first, _ = split("m", joined, {"TOKENS": np.zeros((2, 3, 4), np.float32)}, varlen)
    assert first["TOKENS"].shape == (1, 3, 4)


def test_an_output_that_lost_the_dimension_it_follows_fails_the_batch_with_the_output_named():
    varlen = spec(TEXT, TEXT_PADDING)
    joined = join([ids([1, 2]), ids([3, 4, 5])], varlen)
    with pytest.raises(ModelExecutionError, match="output 'TOKENS' has shape \\[1\\]"):
        split("m", joined, {"TOKENS": np.zeros(2, np.float32)}, varlen)


def test_two_variable_dims_pad_both_and_lengths_hold_both_extents():
    varlen = spec("""input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 2, -1, -1 ] },
                             { name: "SIZE" data_type: TYPE_INT64 dims: [ 2 ] } ]
                     output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2, -1, -1 ] } ]""",
                  {"inferd.padding": "true", "inferd.lengths_input": "SIZE", "inferd.pad_value": "-1"})
    a = np.ones((1, 2, 2, 3), np.float32)
    b = np.full((1, 2, 3, 1), 2, np.float32)
    joined = join([{"IMAGE": a}, {"IMAGE": b}], varlen)
    image = joined.inputs["IMAGE"]
    assert image.shape == (2, 2, 3, 3)
    assert np.array_equal(image[0, :, :2, :3], a[0]) and (image[0, :, 2, :] == -1).all()
    assert np.array_equal(image[1, :, :, :1], b[0]) and (image[1, :, :, 1:] == -1).all()
    assert joined.inputs["SIZE"].tolist() == [[2, 3], [3, 1]]
    out_a, out_b = split("m", joined, {"OUT": image * 10}, varlen)
    assert np.array_equal(out_a["OUT"], a * 10) and np.array_equal(out_b["OUT"], b * 10)


def test_a_mask_over_a_prefix_of_the_reference_dims():
    varlen = spec("""input [ { name: "EMB" data_type: TYPE_FP16 dims: [ -1, 3 ] },
                             { name: "KEEP" data_type: TYPE_BOOL dims: [ -1 ] } ]
                     output [ { name: "OUT" data_type: TYPE_FP16 dims: [ 3 ] } ]""",
                  {"inferd.padding": "true", "inferd.mask_input": "KEEP"})
    joined = join([{"EMB": np.ones((1, 1, 3), np.float16)}, {"EMB": np.ones((1, 3, 3), np.float16)}], varlen)
    assert joined.inputs["KEEP"].tolist() == [[True, False, False], [True, True, True]]
    assert joined.inputs["EMB"].shape == (2, 3, 3) and joined.inputs["EMB"][0, 1:].sum() == 0


RAGGED = """input [ { name: "RAGGED" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def ragged_spec(kind: str, dtype: str = "TYPE_FP32") -> VarlenSpec:
    return spec(RAGGED + f'batch_input [ {{ kind: {kind} target_name: "B" data_type: {dtype} '
                         'source_input: "RAGGED" } ]')


def shaped(*shapes: tuple[int, ...]) -> list[dict[str, np.ndarray]]:
    return [{"RAGGED": np.full(s, float(i), np.float32)} for i, s in enumerate(shapes)]


def test_ragged_inputs_are_one_flat_concatenation():
    joined = join(shaped((1, 2, 1), (1, 1, 3)), ragged_spec("BATCH_ELEMENT_COUNT"))
    assert joined.inputs["RAGGED"].tolist() == [0, 0, 1, 1, 1]


@pytest.mark.parametrize(("kind", "expected"), [
    # Triton's qa/L0_batch_input: four requests of [1, 2], [1, 4], [1, 1], [1, 3].
    ("BATCH_ELEMENT_COUNT", [2, 4, 1, 3]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", [2, 6, 7, 10]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 2, 6, 7, 10]),
])
def test_element_count_kinds(kind, expected):
    joined = join(shaped((1, 1, 2), (1, 1, 4), (1, 1, 1), (1, 1, 3)), ragged_spec(kind))
    assert joined.inputs["B"].tolist() == expected and joined.inputs["B"].dtype == np.float32


def test_element_counts_include_the_batch_dimension_and_int32_is_kept():
    joined = join(shaped((2, 1, 3), (1, 2, 2)), ragged_spec("BATCH_ELEMENT_COUNT", "TYPE_INT32"))
    assert joined.inputs["B"].tolist() == [6, 4] and joined.inputs["B"].dtype == np.int32


def test_max_element_count_as_shape():
    joined = join(shaped((1, 1, 2), (1, 1, 4), (1, 1, 1)), ragged_spec("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"))
    assert joined.inputs["B"].shape == (4,)


def test_item_shape_and_flatten_follow_the_protos_example():
    # model_config.proto: a batch-2 input of shape [3, 1] and a batch-1 input of shape [2, 2].
    requests = shaped((2, 3, 1), (1, 2, 2))
    assert join(requests, ragged_spec("BATCH_ITEM_SHAPE")).inputs["B"].tolist() == [[3, 1], [3, 1], [2, 2]]
    assert join(requests, ragged_spec("BATCH_ITEM_SHAPE_FLATTEN")).inputs["B"].tolist() == [3, 1, 3, 1, 2, 2]


def test_scatter_with_input_shape_gives_each_request_its_own_shape():
    varlen = spec("""input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
                     output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
                     batch_output [ { target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "IN" } ]""")
    requests = [{"IN": np.full((1, n), n, np.float32)} for n in (2, 4, 1)]
    joined = join(requests, varlen)
    outputs = split("m", joined, {"OUT": joined.inputs["IN"] * 2}, varlen)
    assert [o["OUT"].tolist() for o in outputs] == [[[4, 4]], [[8, 8, 8, 8]], [[2]]]
    with pytest.raises(ModelExecutionError, match="output 'OUT' has 3 elements"):
        split("m", joined, {"OUT": np.zeros(3, np.float32)}, varlen)


def test_without_varlen_inputs_are_concatenated_and_outputs_split_by_rows():
    joined = join([{"X": np.zeros((2, 3))}, {"X": np.ones((1, 3))}])
    assert joined.inputs["X"].shape == (3, 3) and joined.rows == [2, 1]
    first, second = split("m", joined, {"Y": np.arange(3)})
    assert first["Y"].tolist() == [0, 1] and second["Y"].tolist() == [2]


def test_a_mask_the_client_sent_is_kept_and_padded_with_zero():
    varlen = spec(TEXT, TEXT_PADDING)
    sent = [{"IDS": np.array([[1, 2]]), "MASK": np.array([[1, 1]]), "LENGTHS": np.array([[2]], np.int32)},
            {"IDS": np.array([[3, 4, 5]]), "MASK": np.array([[1, 1, 0]]), "LENGTHS": np.array([[2]], np.int32)}]
    joined = join(sent, varlen)
    assert joined.inputs["MASK"].tolist() == [[1, 1, 0], [1, 1, 0]]
    assert joined.inputs["LENGTHS"].tolist() == [[2], [2]]  # as sent
    assert (joined.real_elements, joined.pad_elements) == (5, 1)  # only IDS counts
