"""Helpers for tests that build small Triton model repositories in tmp_path."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import onnx

from inferd.examples import onnx_models as om

Tensor = tuple[str, str, Sequence[int]]  # (name, "TYPE_FP32", dims)


def tensors(kind: str, items: Sequence[Tensor], extra: dict[str, str] | None = None) -> str:
    """``input [ {...}, ... ]`` in config.pbtxt text; ``extra`` adds raw text to a tensor by name."""
    parts = []
    for name, data_type, dims in items:
        more = (extra or {}).get(name, "")
        parts.append(f'  {{ name: "{name}" data_type: {data_type} dims: [ {", ".join(map(str, dims))} ] {more} }}')
    return f"{kind} [\n" + ",\n".join(parts) + "\n]\n"


def config(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], max_batch_size: int = 0,
           extra: str = "", platform: str | None = "onnxruntime_onnx",
           input_extra: dict[str, str] | None = None, output_extra: dict[str, str] | None = None) -> str:
    text = f'name: "{name}"\n'
    if platform:
        text += f'platform: "{platform}"\n'
    text += f"max_batch_size: {max_batch_size}\n"
    text += tensors("input", inputs, input_extra)
    text += tensors("output", outputs, output_extra)
    return text + extra


def add_model(repo: Path, name: str, model: onnx.ModelProto | bytes | None, config_text: str | None,
              versions: Sequence[int] = (1,), filename: str = "model.onnx") -> Path:
    """Write ``repo/name/config.pbtxt`` (unless None) and ``repo/name/<v>/<filename>`` for each version."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config_text is not None:
        (model_dir / "config.pbtxt").write_text(config_text)
    if model is not None:
        data = model if isinstance(model, bytes) else om.serialize(model)
        for v in versions:
            (model_dir / str(v)).mkdir(exist_ok=True)
            (model_dir / str(v) / filename).write_bytes(data)
    return model_dir


def sleeping_identity(seconds: float) -> str:
    """A Python model's source: OUTPUT0 = INPUT0 for each request, after sleeping ``seconds`` an execution
    (a model of known small capacity that leaves the CPU to the server)."""
    return f'''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({seconds!r})
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def add_python_model(repo: Path, name: str, source: str, config_text: str) -> Path:
    """A Python model: ``source`` as ``repo/name/1/model.py`` and the (dedented) config beside it."""
    return add_model(repo, name, source.encode(), textwrap.dedent(config_text), filename="model.py")
