"""The example text generator: its weights and its configs.

``python_models/generator.py`` is the model; this module writes what it
loads (``weights.npz``: a byte embedding, a GRU's layers in torch's layout,
an output head; from ``numpy.random.default_rng(seed)``, so every platform
builds the same bytes) and renders its ``config.pbtxt`` for each way it can be
batched: ``continuous`` (``iterative_sequence``: rows join and leave between
steps), ``request`` (dynamic batching: a batch runs until its longest request
ends) and ``none`` (one request at a time). The repository holds the first;
the benchmark (bench/scenarios/generative.py) builds the others.
"""

from __future__ import annotations

import io

import numpy as np

VOCAB, EMBED, HIDDEN, LAYERS, SEED = 256, 64, 256, 2, 0
MAX_BATCH = 32
MAX_NEW_TOKENS = 256


def weights(hidden: int = HIDDEN, embed: int = EMBED, layers: int = LAYERS, seed: int = SEED) -> bytes:
    """``weights.npz`` bytes (deterministic for the arguments)."""
    rng = np.random.default_rng(seed)

    def uniform(shape: tuple[int, ...], fan: int) -> np.ndarray:
        bound = 1.0 / np.sqrt(fan)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    arrays: dict[str, np.ndarray] = {"layers": np.array(layers, dtype=np.int64),
                                     "embed": rng.standard_normal((VOCAB, embed)).astype(np.float32)}
    for i in range(layers):
        width = embed if i == 0 else hidden
        arrays[f"w_ih_{i}"] = uniform((3 * hidden, width), hidden)
        arrays[f"w_hh_{i}"] = uniform((3 * hidden, hidden), hidden)
        arrays[f"b_ih_{i}"] = uniform((3 * hidden,), hidden)
        arrays[f"b_hh_{i}"] = uniform((3 * hidden,), hidden)
    # A sharper head than torch's default init, so greedy decoding wanders over
    # many bytes instead of settling on one.
    arrays["head_w"] = (rng.standard_normal((VOCAB, hidden)) * 3.0 / np.sqrt(hidden)).astype(np.float32)
    arrays["head_b"] = np.zeros(VOCAB, dtype=np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


# The /v1 settings (inferd/config/_openai.py): a chat model; the GRU has no context limit of its own,
# the example sets one so that an over-long prompt is refused as a real model's would be.
OPENAI = {"inferd.openai": "chat", "inferd.openai.bos_token": "<s>", "inferd.openai.eos_token": "</s>",
          "inferd.openai.max_context": "2048"}

BATCHINGS = ("continuous", "request", "request_compact", "none")


def config(name: str = "generator", batching: str = "continuous", max_batch_size: int = MAX_BATCH,
           hidden: int = HIDDEN, layers: int = LAYERS, max_new_tokens: int = MAX_NEW_TOKENS,
           instances: int = 1, openai: bool = False) -> str:
    """The generator's config.pbtxt, batched ``continuous``ly, per ``request`` (static: a batch
    runs, padded, until its longest request ends; ``request_compact``: finished rows leave
    the computation), or ``none``."""
    if batching not in BATCHINGS:
        raise ValueError(f"batching must be one of {', '.join(BATCHINGS)}, got {batching!r}")
    text = f'''name: "{name}"
backend: "python"
max_batch_size: {1 if batching == "none" else max_batch_size}
input [ {{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }}
]
model_transaction_policy {{ decoupled: true }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "max_new_tokens" value: {{ string_value: "{max_new_tokens}" }} }}
'''
    if openai:  # served under /v1 too: its tokenizer.json and chat_template.jinja beside the config
        text += "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in OPENAI.items())
    if batching.startswith("request"):
        text += "dynamic_batching { }\n"
    if batching == "request_compact":
        text += 'parameters { key: "request_batching" value: { string_value: "compact" } }\n'
    if batching == "continuous":
        text += f'''sequence_batching {{
  iterative_sequence: true
  state [
    {{
      input_name: "HIDDEN_IN"
      output_name: "HIDDEN_OUT"
      data_type: TYPE_FP32
      dims: [ {layers}, {hidden} ]
      initial_state {{ name: "zeros" data_type: TYPE_FP32 dims: [ {layers}, {hidden} ] zero_data: true }}
    }},
    {{
      input_name: "LAST_IN"
      output_name: "LAST_OUT"
      data_type: TYPE_INT32
      dims: [ 2 ]
      initial_state {{ name: "zeros" data_type: TYPE_INT32 dims: [ 2 ] zero_data: true }}
    }}
  ]
}}
'''
    return text
