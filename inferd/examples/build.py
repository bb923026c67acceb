"""Write the example model repository in Triton's layout.

    python -m inferd.examples.build --output model_repository [--model NAME ...]

Each entry of :data:`MODELS` is a :class:`ModelSpec`: a model name, its
``config.pbtxt`` text and a mapping of repository-relative file paths to bytes (or
zero-argument callables producing bytes, evaluated lazily).  To add a model
(ensemble, python backend, torchscript, ...) append a ``ModelSpec`` to
:data:`MODELS`; :func:`triton_config` renders the usual config text.

Building is idempotent and deterministic: a file is rewritten only when its bytes
change (mtimes of unchanged files are preserved), and nothing else under the
output directory is touched or removed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import onnx_models as om

FileContent = bytes | Callable[[], bytes]
Tensor = tuple[str, str, Sequence[int]]  # (name, "TYPE_FP32", dims)


@dataclass(frozen=True)
class ModelSpec:
    """One model directory: ``<root>/<name>/config.pbtxt`` plus ``files``.

    ``files`` maps paths relative to ``<root>/<name>/`` (e.g. ``"1/model.onnx"``) to
    bytes or to a callable returning bytes.
    """

    name: str
    config_text: str
    files: Mapping[str, FileContent] = field(default_factory=dict)

    def render(self) -> dict[str, bytes]:
        """All files of this model (config first), relative to the model directory."""
        out = {"config.pbtxt": self.config_text.encode()}
        for rel, content in self.files.items():
            out[rel] = content() if callable(content) else content
        return out


def _dims(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(int(d)) for d in dims) + " ]"


def _tensors(kind: str, tensors: Sequence[Tensor]) -> str:
    items = []
    for name, data_type, dims in tensors:
        items.append(
            "  {\n"
            f'    name: "{name}"\n'
            f"    data_type: {data_type}\n"
            f"    dims: {_dims(dims)}\n"
            "  }"
        )
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def triton_config(
    name: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    max_batch_size: int = 0,
    platform: str | None = "onnxruntime_onnx",
    backend: str | None = None,
    dynamic_batching: str | None = None,
    instance_count: int = 1,
    instance_kind: str = "KIND_CPU",
    extra: str = "",
) -> str:
    """Render a config.pbtxt in Triton's text-protobuf syntax.

    ``dynamic_batching``: None -> no block; a string -> its body (``""`` gives
    ``dynamic_batching { }``).  ``extra`` is appended verbatim (e.g. an
    ``ensemble_scheduling`` block or ``parameters``).
    """
    text = f'name: "{name}"\n'
    if platform:
        text += f'platform: "{platform}"\n'
    if backend:
        text += f'backend: "{backend}"\n'
    text += f"max_batch_size: {int(max_batch_size)}\n"
    text += _tensors("input", inputs)
    text += _tensors("output", outputs)
    if instance_count:
        text += (
            "instance_group [\n"
            f"  {{\n    count: {int(instance_count)}\n    kind: {instance_kind}\n  }}\n"
            "]\n"
        )
    if dynamic_batching is not None:
        body = dynamic_batching.strip()
        text += f"dynamic_batching {{\n  {body}\n}}\n" if body else "dynamic_batching { }\n"
    if extra:
        text += extra if extra.endswith("\n") else extra + "\n"
    return text


def onnx_file(build: Callable[[], object]) -> Callable[[], bytes]:
    """Lazily serialize an ONNX builder call: ``onnx_file(lambda: om.mlp())``."""
    return lambda: om.serialize(build())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the model table

MLP_D_IN, MLP_HIDDEN, MLP_D_OUT, MLP_SEED = 256, 1024, 256, 0

_FP32_MLP_IO = (
    [("INPUT0", "TYPE_FP32", [MLP_D_IN])],
    [("OUTPUT0", "TYPE_FP32", [MLP_D_OUT])],
)
_ADD_SUB_IO = (
    [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])],
    [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])],
)


def _mlp_bytes() -> bytes:
    return om.serialize(om.mlp(MLP_D_IN, MLP_HIDDEN, MLP_D_OUT, seed=MLP_SEED))


MODELS: list[ModelSpec] = [
    ModelSpec(
        "simple",
        triton_config("simple", *_ADD_SUB_IO, max_batch_size=8, dynamic_batching=""),
        {"1/model.onnx": onnx_file(lambda: om.add_sub(np.int32, 16, batch=True))},
    ),
    ModelSpec(
        "add_sub",
        triton_config("add_sub", *_ADD_SUB_IO, max_batch_size=0),
        {"1/model.onnx": onnx_file(lambda: om.add_sub(np.int32, 16, batch=False))},
    ),
    ModelSpec(
        "identity_fp32",
        triton_config(
            "identity_fp32",
            [("INPUT0", "TYPE_FP32", [-1])],
            [("OUTPUT0", "TYPE_FP32", [-1])],
            max_batch_size=64,
            dynamic_batching="",
        ),
        {"1/model.onnx": onnx_file(lambda: om.identity(np.float32, [-1], batch=True))},
    ),
    ModelSpec(
        "simple_string",
        triton_config(
            "simple_string",
            [("INPUT0", "TYPE_STRING", [16])],
            [("OUTPUT0", "TYPE_STRING", [16])],
            max_batch_size=8,
        ),
        {"1/model.onnx": onnx_file(lambda: om.identity(object, [16], batch=True))},
    ),
    ModelSpec(
        "mlp",
        triton_config(
            "mlp", *_FP32_MLP_IO, max_batch_size=64,
            dynamic_batching="max_queue_delay_microseconds: 0",
        ),
        {"1/model.onnx": _mlp_bytes},
    ),
    ModelSpec(
        "mlp_nobatch",  # same weights as "mlp"; no dynamic_batching block
        triton_config("mlp_nobatch", *_FP32_MLP_IO, max_batch_size=64),
        {"1/model.onnx": _mlp_bytes},
    ),
]


# TorchScript and Python backend examples. TorchScript files are built with
# torch.jit.script from inferd.examples.torch_models (weights from a fixed numpy
# seed); Python models are model.py sources kept as plain files in
# inferd/examples/python_models and copied verbatim.

TORCH_MLP_D_IN, TORCH_MLP_HIDDEN, TORCH_MLP_D_OUT, TORCH_MLP_SEED = 16, 32, 4, 0
TOKENIZER_LENGTH = 16  # INPUT_IDS / ATTENTION_MASK length; vocabulary size 1024


def _torch_file(builder: str, **kwargs: object) -> Callable[[], bytes]:
    def build() -> bytes:
        from . import torch_models

        return getattr(torch_models, builder)(**kwargs)

    return build


def _python_file(name: str) -> Callable[[], bytes]:
    def build() -> bytes:
        from .python_models import source

        return source(name)

    return build


MODELS += [
    ModelSpec(
        "torch_add_sub",  # INPUT__0/OUTPUT__0 naming: forward's arguments and results by index
        triton_config(
            "torch_add_sub",
            [("INPUT__0", "TYPE_INT32", [16]), ("INPUT__1", "TYPE_INT32", [16])],
            [("OUTPUT__0", "TYPE_INT32", [16]), ("OUTPUT__1", "TYPE_INT32", [16])],
            max_batch_size=8, platform="pytorch_libtorch", dynamic_batching="",
        ),
        {"1/model.pt": _torch_file("add_sub")},
    ),
    ModelSpec(
        "torch_mlp",  # input named after forward's argument; outputs in the config's order
        triton_config(
            "torch_mlp",
            [("features", "TYPE_FP32", [TORCH_MLP_D_IN])],
            [("logits", "TYPE_FP32", [TORCH_MLP_D_OUT]), ("probabilities", "TYPE_FP32", [TORCH_MLP_D_OUT])],
            max_batch_size=32, platform="pytorch_libtorch", dynamic_batching="",
        ),
        {"1/model.pt": _torch_file("mlp", d_in=TORCH_MLP_D_IN, hidden=TORCH_MLP_HIDDEN, d_out=TORCH_MLP_D_OUT,
                                   seed=TORCH_MLP_SEED)},
    ),
    ModelSpec(
        "tokenizer",  # BYTES text -> INT64 ids and mask, padded to TOKENIZER_LENGTH
        triton_config(
            "tokenizer",
            [("TEXT", "TYPE_STRING", [1])],
            [("INPUT_IDS", "TYPE_INT64", [TOKENIZER_LENGTH]), ("ATTENTION_MASK", "TYPE_INT64", [TOKENIZER_LENGTH])],
            max_batch_size=8, platform=None, backend="python", dynamic_batching="",
        ),
        {"1/model.py": _python_file("tokenizer")},
    ),
]


# Ensembles (platform "ensemble"): ensemble_mlp runs scale -> mlp -> relu as three
# batching ONNX models; mlp_fused is the same computation as one ONNX model (the
# benchmark's baseline); ensemble_parallel runs scale and relu of one input as two
# concurrent branches joined by an add. An ensemble has no model file, only an
# (empty) version folder, as Triton requires.

ENSEMBLE_SCALE = 2.0


def ensemble_steps(steps: Sequence[tuple[str, Mapping[str, str], Mapping[str, str]]], max_inflight: int = 0) -> str:
    """An ``ensemble_scheduling`` block: (model, {model input: tensor}, {model output: tensor}) per step."""
    out = "ensemble_scheduling {\n"
    if max_inflight:
        out += f"  max_inflight_requests: {int(max_inflight)}\n"
    out += "  step [\n"
    rendered = []
    for model, inputs, outputs in steps:
        text = f'    {{\n      model_name: "{model}"\n      model_version: -1\n'
        for key, value in inputs.items():
            text += f'      input_map {{ key: "{key}" value: "{value}" }}\n'
        for key, value in outputs.items():
            text += f'      output_map {{ key: "{key}" value: "{value}" }}\n'
        rendered.append(text + "    }")
    return out + ",\n".join(rendered) + "\n  ]\n}\n"


def _ensemble(name: str, io: tuple[Sequence[Tensor], Sequence[Tensor]], max_batch_size: int, steps) -> ModelSpec:  # type: ignore[no-untyped-def]
    config = triton_config(name, *io, max_batch_size=max_batch_size, platform="ensemble", instance_count=0,
                           extra=ensemble_steps(steps))
    return ModelSpec(name, config, {"1/.keep": b""})


MODELS += [
    ModelSpec(
        "ens_scale",
        triton_config("ens_scale", *_FP32_MLP_IO, max_batch_size=64, dynamic_batching=""),
        {"1/model.onnx": onnx_file(lambda: om.scale(MLP_D_IN, ENSEMBLE_SCALE))},
    ),
    ModelSpec(
        "ens_mlp",  # the weights of "mlp"; its own model so its statistics are the ensemble's
        triton_config("ens_mlp", *_FP32_MLP_IO, max_batch_size=64, dynamic_batching=""),
        {"1/model.onnx": _mlp_bytes},
    ),
    ModelSpec(
        "ens_relu",
        triton_config("ens_relu", *_FP32_MLP_IO, max_batch_size=64, dynamic_batching=""),
        {"1/model.onnx": onnx_file(lambda: om.relu(MLP_D_OUT))},
    ),
    ModelSpec(
        "ens_add",  # OUTPUT0 = INPUT0 + INPUT1 (and OUTPUT1 = INPUT0 - INPUT1, unused)
        triton_config(
            "ens_add",
            [("INPUT0", "TYPE_FP32", [MLP_D_IN]), ("INPUT1", "TYPE_FP32", [MLP_D_IN])],
            [("OUTPUT0", "TYPE_FP32", [MLP_D_IN]), ("OUTPUT1", "TYPE_FP32", [MLP_D_IN])],
            max_batch_size=64, dynamic_batching="",
        ),
        {"1/model.onnx": onnx_file(lambda: om.add_sub(np.float32, MLP_D_IN, batch=True))},
    ),
    ModelSpec(
        "mlp_fused",  # relu(mlp(scale(x))) as one ONNX model: what ensemble_mlp computes
        triton_config("mlp_fused", *_FP32_MLP_IO, max_batch_size=64, dynamic_batching=""),
        {"1/model.onnx": onnx_file(lambda: om.fused_scale_mlp_relu(
            MLP_D_IN, MLP_HIDDEN, MLP_D_OUT, factor=ENSEMBLE_SCALE, seed=MLP_SEED))},
    ),
    _ensemble("ensemble_mlp", _FP32_MLP_IO, 64, [
        ("ens_scale", {"INPUT0": "INPUT0"}, {"OUTPUT0": "scaled"}),
        ("ens_mlp", {"INPUT0": "scaled"}, {"OUTPUT0": "hidden"}),
        ("ens_relu", {"INPUT0": "hidden"}, {"OUTPUT0": "OUTPUT0"}),
    ]),
    _ensemble("ensemble_parallel", _FP32_MLP_IO, 64, [
        ("ens_scale", {"INPUT0": "INPUT0"}, {"OUTPUT0": "scaled"}),
        ("ens_relu", {"INPUT0": "INPUT0"}, {"OUTPUT0": "rectified"}),
        ("ens_add", {"INPUT0": "scaled", "INPUT1": "rectified"}, {"OUTPUT0": "OUTPUT0"}),
    ]),
]


# Stateful sequences and decoupled models. simple_sequence is Triton's
# simple_sequence as ONNX: OUTPUT is the running sum of INPUT over the sequence,
# reset by START. ONNX graphs hold no state between runs, so the sum lives in
# implicit state (sequence_batching.state: ACC_OUT fed back as ACC_IN, zeros on
# START) that the sequence batcher keeps per sequence. repeat_decoupled streams
# REPEAT copies of IN (decoupled: model_transaction_policy { decoupled: true }).

SEQUENCE_IDLE_US = 5_000_000

_SIMPLE_SEQUENCE_BATCHING = f"""sequence_batching {{
  max_sequence_idle_microseconds: {SEQUENCE_IDLE_US}
  direct {{ }}
  state [
    {{
      input_name: "ACC_IN"
      output_name: "ACC_OUT"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state {{ name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }}
    }}
  ]
}}
"""

MODELS += [
    ModelSpec(
        "simple_sequence",
        triton_config("simple_sequence", [("INPUT", "TYPE_INT32", [1])], [("OUTPUT", "TYPE_INT32", [1])],
                      max_batch_size=8, extra=_SIMPLE_SEQUENCE_BATCHING),
        {"1/model.onnx": onnx_file(lambda: om.accumulator(np.int32))},
    ),
    ModelSpec(
        "repeat_decoupled",
        triton_config(
            "repeat_decoupled",
            [("IN", "TYPE_INT32", [-1]), ("REPEAT", "TYPE_INT32", [1])],
            [("OUT", "TYPE_INT32", [-1]), ("IDX", "TYPE_UINT32", [1])],
            max_batch_size=0, platform=None, backend="python",
            extra="model_transaction_policy { decoupled: true }",
        ),
        {"1/model.py": _python_file("repeat_decoupled")},
    ),
]


# Variable-length batching: a small transformer text encoder (inferd/examples/encoder.py) that
# takes INPUT_IDS and ATTENTION_MASK; clients send INPUT_IDS of any length (1..512 tokens) and
# inferd pads requests of one length bucket into a batch and fills ATTENTION_MASK. As ONNX
# (exported from torch) and as TorchScript.

ENCODER_BUCKETS = "16,32,64,128,256,512"
ENCODER_MAX_BATCH_ELEMENTS = 1024  # padded tokens per execution: 2 rows of 512 ... 32 of 32 (max_batch_size caps rows)
# On a CPU a batch of long sequences costs more per request than running them alone (attention
# scores grow as rows x length^2 and leave the caches), so the budget keeps long batches short.
ENCODER_MAX_BATCH = 32
DIM_ENCODER = 64  # inferd.examples.encoder.DIM (not imported here: that module imports torch)


def parameters(values: Mapping[str, object]) -> str:
    """``parameters`` entries for a config.pbtxt, one per key (values rendered with str)."""
    def quoted(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"')

    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{quoted(v)}" }} }}\n' for k, v in values.items())


def encoder_config(name: str, platform: str, padding: Mapping[str, object] | None = None,
                   dynamic_batching: str | None = "", more: Mapping[str, object] | None = None) -> str:
    """The encoder's config; ``padding`` None: clients send ATTENTION_MASK themselves.

    It executes on its instance's thread (``inferd.execution``): a padded batch takes milliseconds,
    and requests that arrive meanwhile queue and form the next batch (inline on the event loop,
    calibrated on a one-token sample, it would look fast and run requests nearly one by one).
    """
    inputs = [("INPUT_IDS", "TYPE_INT64", [-1]), ("ATTENTION_MASK", "TYPE_INT64", [-1])]
    outputs = [("EMBEDDING", "TYPE_FP32", [DIM_ENCODER])]
    values = {"inferd.execution": "thread", **(padding or {}), **(more or {})}
    return triton_config(name, inputs, outputs, max_batch_size=ENCODER_MAX_BATCH, platform=platform,
                         dynamic_batching=dynamic_batching, extra=parameters(values))


ENCODER_PADDING = {
    "inferd.padding": "true",
    "inferd.mask_input": "ATTENTION_MASK",
    "inferd.length_buckets": ENCODER_BUCKETS,
    "inferd.max_batch_elements": ENCODER_MAX_BATCH_ELEMENTS,
}


def _encoder_file(kind: str) -> Callable[[], bytes]:
    def build() -> bytes:
        from . import encoder

        return encoder.onnx_bytes() if kind == "onnx" else encoder.torchscript_bytes()

    return build


def _text_asset(name: str) -> Callable[[], bytes]:
    def build() -> bytes:
        from . import text_assets

        if name == "chat_template":
            return text_assets.CHAT_TEMPLATE.encode()
        return text_assets.byte_tokenizer() if name == "byte" else text_assets.encoder_tokenizer()

    return build


# The ONNX encoder is served under /v1/embeddings too: its tokenizer gives ids below its vocabulary,
# its output is already mean-pooled over the real tokens.
ENCODER_OPENAI = {"inferd.openai": "embedding", "inferd.openai.pooling": "none",
                  "inferd.openai.max_context": 512, "inferd.openai.dimensions": "16,32"}

MODELS += [
    ModelSpec("text_encoder", encoder_config("text_encoder", "onnxruntime_onnx", ENCODER_PADDING, more=ENCODER_OPENAI),
              {"1/model.onnx": _encoder_file("onnx"), "tokenizer.json": _text_asset("encoder")}),
    ModelSpec("text_encoder_torch", encoder_config("text_encoder_torch", "pytorch_libtorch", ENCODER_PADDING),
              {"1/model.pt": _encoder_file("torchscript")}),
]


# Generative: a byte-level GRU language model (Python, torch) whose steps are
# batched continuously (sequence_batching.iterative_sequence); see
# inferd/examples/generator_assets.py.


def _generator_weights() -> bytes:
    import torch  # noqa: F401  # the model runs on PyTorch (an extra): without it, it is skipped

    from . import generator_assets as generator

    return generator.weights()


def _generator_config() -> str:
    from . import generator_assets as generator

    return generator.config(openai=True)


MODELS += [
    ModelSpec("generator", _generator_config(), {
        "1/model.py": _python_file("generator"),
        "1/weights.npz": _generator_weights,
        # Served under /v1 as a chat model (inferd/examples/text_assets.py).
        "tokenizer.json": _text_asset("byte"),
        "chat_template.jinja": _text_asset("chat_template"),
    }),
]


# --------------------------------------------------------------------------- writing


# A cascade (conditional steps, an inferd extension: docs/ensembles.md): cascade_cheap scales
# each row and says how sure it is (SCORE); cascade runs cascade_expensive (an MLP) only for the
# rows whose SCORE is below 0.8 and takes cascade_cheap's rows for the others. The step rule is
# a parameter, which a plain Triton server ignores (there the expensive step runs every row).
# cascade_bls is the same logic as BLS in a Python model, for comparison.

CASCADE_D, CASCADE_THRESHOLD = 16, 0.8
_CASCADE_IO = ([("INPUT0", "TYPE_FP32", [CASCADE_D])], [("OUTPUT0", "TYPE_FP32", [CASCADE_D])])


def cascade_config() -> str:
    config = triton_config("cascade", *_CASCADE_IO, max_batch_size=8, platform="ensemble", instance_count=0,
                           extra=parameters({"inferd.step.1.when_row": f"SCORE < {CASCADE_THRESHOLD}",
                                             "inferd.step.1.otherwise": "OUTPUT0=cheap_out"})
                           + ensemble_steps([
                               ("cascade_cheap", {"INPUT0": "INPUT0"}, {"OUTPUT0": "cheap_out", "SCORE": "SCORE"}),
                               ("cascade_expensive", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
                           ]))
    return config


MODELS += [
    ModelSpec(
        "cascade_cheap",
        triton_config("cascade_cheap", _CASCADE_IO[0], [*_CASCADE_IO[1], ("SCORE", "TYPE_FP32", [1])],
                      max_batch_size=8, dynamic_batching=""),
        {"1/model.onnx": onnx_file(lambda: om.confident(CASCADE_D))},
    ),
    ModelSpec(
        "cascade_expensive",
        triton_config("cascade_expensive", *_CASCADE_IO, max_batch_size=8, dynamic_batching=""),
        {"1/model.onnx": onnx_file(lambda: om.mlp(CASCADE_D, 256, CASCADE_D, seed=MLP_SEED))},
    ),
    ModelSpec("cascade", cascade_config(), {"1/.keep": b""}),
    ModelSpec(
        "cascade_bls",
        triton_config("cascade_bls", *_CASCADE_IO, max_batch_size=8, platform=None, backend="python"),
        {"1/model.py": _python_file("cascade_bls")},
    ),
]

def write_model(spec: ModelSpec, root: str | os.PathLike[str]) -> list[str]:
    """Write one model under ``root``; returns the relative paths actually (re)written."""
    model_dir = os.path.join(os.fspath(root), spec.name)
    written = []
    for rel, data in spec.render().items():
        if om.write_bytes_if_changed(os.path.join(model_dir, rel), data):
            written.append(rel)
    return written


def build_repository(
    output: str | os.PathLike[str],
    models: Iterable[ModelSpec] | None = None,
    only: Iterable[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> dict[str, list[str]]:
    """Write ``models`` (default :data:`MODELS`, optionally filtered by name ``only``) under
    ``output``.  Returns ``{model_name: [rewritten relative paths]}``."""
    specs = list(MODELS if models is None else models)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate model names in {names}")
    if only is not None:
        wanted = set(only)
        unknown = wanted - set(names)
        if unknown:
            raise ValueError(f"unknown model(s): {sorted(unknown)}; known: {names}")
        specs = [s for s in specs if s.name in wanted]
    os.makedirs(output, exist_ok=True)
    result = {}
    for spec in specs:
        try:
            written = write_model(spec, output)
        except ModuleNotFoundError as exc:
            if exc.name not in ("torch", "tokenizers"):
                raise
            if log is not None:  # PyTorch and the tokenizers library are extras: the other models still build
                what, extra = ("PyTorch", "torch") if exc.name == "torch" else ("the tokenizers library", "openai")
                log(f"{spec.name}: skipped, building it needs {what}: pip install 'inferd[{extra}]'")
            continue
        result[spec.name] = written
        if log is not None:
            state = f"wrote {', '.join(written)}" if written else "unchanged"
            log(f"{spec.name}: {state} ({os.path.join(os.fspath(output), spec.name)})")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferd.examples.build",
        description="Write the inferd example models as a Triton model repository.",
    )
    parser.add_argument("--output", "-o", required=True, help="model repository directory")
    parser.add_argument(
        "--model", action="append", dest="models", metavar="NAME",
        help="only build this model (repeatable); default: all",
    )
    parser.add_argument("--list", action="store_true", help="list model names and exit")
    args = parser.parse_args(argv)
    if args.list:
        for spec in MODELS:
            print(spec.name)
        return 0
    try:
        build_repository(args.output, only=args.models)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
