"""A repository of many small ONNX models that hold real memory, for on-demand loading
(tests/test_on_demand.py, bench/scenarios/residency.py, bench/scenarios/many_models.py).

Each model ``<prefix>NN`` is a lookup table: ``Y = TABLE[I]`` (``I``: INT64 [1], ``Y``: FP32 [1]),
``TABLE[i] = NN * 1_000_000 + i``, so every answer says which model gave it and the table (an
initializer of ``floats`` elements: 4 bytes each) is what the loaded model holds. Nothing is
random; the same arguments write the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from inferd.examples.onnx_models import IR_VERSION, OPSET, PRODUCER, serialize


def table_model(index: int, floats: int) -> bytes:
    table = (np.arange(floats, dtype=np.float64) + index * 1_000_000).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["TABLE", "I"], ["Y"], axis=0)], f"table{index}",
        [helper.make_tensor_value_info("I", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(table, "TABLE")])
    model = helper.make_model(graph, producer_name=PRODUCER, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return serialize(model)


def expected(index: int, i: int) -> float:
    """What model ``index`` answers for ``I = i``."""
    return float(np.float32(index * 1_000_000 + i))


def table_config(name: str, extra: str = "") -> str:
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
            'input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n' + extra)


def add_table_model(repo: Path, name: str, index: int, floats: int, extra: str = "") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(table_config(name, extra))
    (folder / "1" / "model.onnx").write_bytes(table_model(index, floats))
    return folder


def pinned(text: str = "true") -> str:
    return f'parameters {{ key: "inferd.pinned" value: {{ string_value: "{text}" }} }}\n'


def build_many(repo: Path, count: int, floats: int | Sequence[int], prefix: str = "m") -> list[str]:
    """``count`` table models ``<prefix>00``.. of ``floats`` elements each (or ``floats[i]`` for model
    ``i``: mixed sizes); their names."""
    sizes = [floats] * count if isinstance(floats, int) else list(floats)
    if len(sizes) != count:
        raise ValueError(f"build_many: {count} models but {len(sizes)} sizes")
    names = []
    for i in range(count):
        name = f"{prefix}{i:02d}"
        add_table_model(repo, name, i, sizes[i])
        names.append(name)
    return names


def mixed_sizes(count: int, low_mb: float, high_mb: float, seed: int = 43) -> list[int]:
    """Table sizes (elements) for ``count`` models from ``low_mb`` to ``high_mb`` MB of table, evenly
    spread and shuffled (the same for the same arguments)."""
    mb = np.linspace(low_mb, high_mb, count)
    np.random.default_rng(seed).shuffle(mb)
    return [int(m * 1e6) // 4 for m in mb]
