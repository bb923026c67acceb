"""Variable-length batching at load: every bad padding parameter or ragged-batching field
refused with the model, parameter and value named; good ones give the spec the layers below read."""

from __future__ import annotations

import pytest

from inferd import backends
from inferd.config import ModelSignature, SignatureTensor, parse_config_text, validate
from inferd.dtypes import BY_CONFIG
from inferd.errors import ConfigError

IDS = 'input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
MASKED = ('input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
          '        { name: "MASK" data_type: TYPE_INT64 dims: [ -1 ] } ]\n')
OUT = 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
BATCHING = "dynamic_batching { }\n"


def text(body: str, params: dict[str, str] | None = None, max_batch_size: int = 8, name: str = "enc") -> str:
    out = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n' + body
    for key, value in (params or {}).items():
        out += f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
    return out


def load(body: str, params: dict[str, str] | None = None, max_batch_size: int = 8, signature=None):  # type: ignore[no-untyped-def]
    return validate(parse_config_text(text(body, params, max_batch_size), model="enc"), signature=signature)


PAD = {"inferd.padding": "true"}

# (config body, parameters, words the error must contain): each names model, parameter and value.
REFUSED = {
    "no variable dimension": (
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]\n' + OUT, PAD,
        ["'enc'", "'inferd.padding'", "'true'", "no input has a variable (-1) dimension", "X [16]"]),
    "a padding parameter without padding": (
        IDS + OUT + BATCHING, {"inferd.length_buckets": "16,32"},
        ["'enc'", "'inferd.length_buckets'", "'16,32'", "needs inferd.padding"]),
    "mask input not declared": (
        IDS + OUT, {**PAD, "inferd.mask_input": "ATTENTION"},
        ["'enc'", "'inferd.mask_input'", "'ATTENTION'", "not an input", "['IDS']"]),
    "mask input of the wrong type": (
        'input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '        { name: "MASK" data_type: TYPE_STRING dims: [ -1 ] } ]\n' + OUT, {**PAD, "inferd.mask_input": "MASK"},
        ["'enc'", "'inferd.mask_input'", "'MASK'", "TYPE_STRING", "TYPE_INT64"]),
    "mask input with other dims": (
        'input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '        { name: "MASK" data_type: TYPE_INT64 dims: [ -1, 2 ] } ]\n' + OUT, {**PAD, "inferd.mask_input": "MASK"},
        ["'enc'", "'inferd.mask_input'", "'MASK'", "[-1, 2]", "'IDS' [-1]"]),
    "lengths input not declared": (
        IDS + OUT, {**PAD, "inferd.lengths_input": "LEN"},
        ["'enc'", "'inferd.lengths_input'", "'LEN'", "not an input"]),
    "lengths input of the wrong type": (
        'input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '        { name: "LEN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' + OUT, {**PAD, "inferd.lengths_input": "LEN"},
        ["'enc'", "'inferd.lengths_input'", "'LEN'", "TYPE_FP32", "TYPE_INT32, TYPE_INT64"]),
    "lengths input holding the wrong count": (
        'input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '        { name: "LEN" data_type: TYPE_INT32 dims: [ 2 ] } ]\n' + OUT, {**PAD, "inferd.lengths_input": "LEN"},
        ["'enc'", "'inferd.lengths_input'", "'LEN'", "[2]", "1 element"]),
    "bucket bounds not increasing": (
        IDS + OUT + BATCHING, {**PAD, "inferd.length_buckets": "16,64,32"},
        ["'enc'", "'inferd.length_buckets'", "'16,64,32'", "strictly increasing"]),
    "bucket bounds that are not integers": (
        IDS + OUT + BATCHING, {**PAD, "inferd.length_buckets": "16,big"},
        ["'enc'", "'inferd.length_buckets'", "'16,big'"]),
    "a zero bucket": (
        IDS + OUT + BATCHING, {**PAD, "inferd.length_buckets": "0,16"},
        ["'enc'", "'inferd.length_buckets'", "'0,16'", ">= 1"]),
    "a budget smaller than one max-length row": (
        IDS + OUT + BATCHING, {**PAD, "inferd.length_buckets": "64,512", "inferd.max_batch_elements": "256"},
        ["'enc'", "'inferd.max_batch_elements'", "256", "512"]),
    "a budget that is no integer": (
        IDS + OUT + BATCHING, {**PAD, "inferd.max_batch_elements": "lots"},
        ["'enc'", "'inferd.max_batch_elements'", "'lots'", "integer"]),
    "buckets without dynamic batching": (
        IDS + OUT, {**PAD, "inferd.length_buckets": "16"},
        ["'enc'", "'inferd.length_buckets'", "dynamic_batching"]),
    "a pad value of the wrong type": (
        IDS + OUT, {**PAD, "inferd.pad_value": "IDS:0.5"},
        ["'enc'", "'inferd.pad_value'", "'0.5'", "TYPE_INT64", "'IDS'"]),
    "a pad value for an input that is not padded": (
        IDS + OUT, {**PAD, "inferd.pad_value": "OTHER:1"},
        ["'enc'", "'inferd.pad_value'", "'OTHER'", "not a padded input"]),
    "an unpad rule for an unknown output": (
        IDS + OUT, {**PAD, "inferd.unpad_outputs": "NOPE:IDS"},
        ["'enc'", "'inferd.unpad_outputs'", "'NOPE'", "not an output"]),
    "an unpad rule sharing no variable dimension": (
        IDS + OUT, {**PAD, "inferd.unpad_outputs": "OUT:IDS"},
        ["'enc'", "'inferd.unpad_outputs'", "'OUT'", "share no variable dimension"]),
    "a mask with only optional inputs to pad": (
        'input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] optional: true },\n'
        '        { name: "MASK" data_type: TYPE_INT64 dims: [ -1 ] } ]\n' + OUT, {**PAD, "inferd.mask_input": "MASK"},
        ["'enc'", "'inferd.mask_input'", "['IDS']", "all optional"]),
    "padding without a batch dimension": (
        IDS + OUT, PAD, ["'enc'", "inferd.padding", "max_batch_size >= 1"]),
    "ragged input that is optional": (
        'input [ { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true optional: true } ]\n'
        + OUT, None, ["'enc'", "input 'R'", "allow_ragged_batch", "optional"]),
    "batch input with two sources": (
        IDS + OUT + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
        'source_input: "IDS" source_input: "IDS" } ]\n', None,
        ["'enc'", "batch_input[0]", "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2"]),
    "batch input of another data type": (
        IDS + OUT + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT64 '
        'source_input: "IDS" } ]\n', None,
        ["'enc'", "batch input data type must be TYPE_INT32 or TYPE_FP32", "TYPE_INT64"]),
    "batch input from an unknown source": (
        IDS + OUT + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT32 '
        'source_input: "GONE" } ]\n', None, ["'enc'", "unknown source input name 'GONE'"]),
    "batch input target named twice": (
        IDS + OUT + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
        'source_input: "IDS" }, { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT32 '
        'source_input: "IDS" } ]\n', None, ["'enc'", "batch_input[1]", "target_name 'N' can only be specified once"]),
    "batch input target that is a config input": (
        IDS + OUT + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "IDS" data_type: TYPE_INT32 '
        'source_input: "IDS" } ]\n', None, ["'enc'", "target_name 'IDS' is also a config input"]),
    "batch output to an unknown output": (
        IDS + OUT + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "NOPE" '
        'source_input: "IDS" } ]\n', None, ["'enc'", "batch_output[0]", "unknown target output name 'NOPE'"]),
    "batch output with no source": (
        IDS + OUT + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" } ]\n', None,
        ["'enc'", "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0"]),
    "batch output target named twice": (
        IDS + OUT + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" target_name: "OUT" '
        'source_input: "IDS" } ]\n', None, ["'enc'", "target output name 'OUT' can only be specified once"]),
    "ragged batching with sequence batching": (
        'input [ { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n' + OUT
        + "sequence_batching { }\n", None, ["'enc'", "ragged batching", "sequence_batching"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_at_load_naming_model_parameter_and_value(case):
    body, params, words = REFUSED[case]
    with pytest.raises(ConfigError) as info:
        load(body, params, max_batch_size=0 if case == "padding without a batch dimension" else 8)
    for word in words:
        assert word in str(info.value), (case, str(info.value))


def test_padding_on_a_python_model_is_refused():
    config = parse_config_text('name: "py"\nbackend: "python"\nmax_batch_size: 8\n' + IDS + OUT
                               + 'parameters { key: "inferd.padding" value { string_value: "true" } }', model="py")
    with pytest.raises(ConfigError, match="'py'.*backend 'python'"):
        validate(config, backend=backends.get("python"))


def test_the_mask_becomes_optional_and_the_spec_says_how_to_pad():
    spec = load(MASKED + 'output [ { name: "TOK" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]\n' + BATCHING,
                {**PAD, "inferd.mask_input": "MASK", "inferd.pad_value": "3", "inferd.length_buckets": "8,32",
                 "inferd.max_batch_elements": "64"})
    assert [(t.name, t.optional) for t in spec.inputs.values()] == [("IDS", False), ("MASK", True)]
    assert [(t.name, t.optional) for t in spec.config.input] == [("IDS", False), ("MASK", True)]  # as served
    assert spec.filled_inputs == {}
    varlen = spec.varlen
    assert varlen is not None and varlen.reference == "IDS"
    assert [(p.name, p.variable, int(p.pad)) for p in varlen.padded] == [("IDS", (0,), 3)]
    assert [(f.name, f.kind) for f in varlen.filled] == [("MASK", "mask")]
    assert [(u.output, u.source, u.cuts) for u in varlen.unpad] == [("TOK", "IDS", (0,))]
    assert (varlen.buckets, varlen.max_batch_elements) == ((8, 32), 64)


def test_a_warmup_sample_may_leave_the_mask_out():
    warmup = ('model_warmup [ { name: "w" batch_size: 1 inputs { key: "IDS" value: '
              '{ data_type: TYPE_INT64 dims: [ 4 ] zero_data: true } } } ]\n')
    load(MASKED + OUT + warmup, {**PAD, "inferd.mask_input": "MASK"})
    with pytest.raises(ConfigError, match="no data for inputs \\['MASK'\\]"):
        load(MASKED + OUT + warmup)  # without padding the mask is a plain input


RAGGED_IO = ('input [ { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
             'output [ { name: "O" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
             'batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_FP32 '
             'source_input: "R" } ]\n')


def signature(ragged_shape: list[int], index: bool = True, index_type: str = "TYPE_FP32") -> ModelSignature:
    fp32 = BY_CONFIG["TYPE_FP32"]
    inputs = [SignatureTensor("R", fp32, tuple(ragged_shape))]
    if index:
        inputs.append(SignatureTensor("INDEX", BY_CONFIG[index_type], (-1,)))
    return ModelSignature(tuple(inputs), (SignatureTensor("O", fp32, (-1, -1)),))


def test_a_ragged_model_file_takes_the_input_flat_and_the_batch_input_by_its_target_name():
    spec = load(RAGGED_IO, signature=signature([-1]))
    assert list(spec.inputs) == ["R"] and list(spec.filled_inputs) == ["INDEX"]
    with pytest.raises(ConfigError, match="'enc': input 'R': allow_ragged_batch expects the model file to take it "
                                          "with shape \\[-1\\].*\\[-1, -1\\]"):
        load(RAGGED_IO, signature=signature([-1, -1]))
    with pytest.raises(ConfigError, match="batch_input target 'INDEX' is not an input of the model file"):
        load(RAGGED_IO, signature=signature([-1], index=False))
    with pytest.raises(ConfigError, match="batch_input target 'INDEX'.*TYPE_INT32"):
        load(RAGGED_IO, signature=signature([-1], index_type="TYPE_INT32"))
