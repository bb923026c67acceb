"""A small transformer text encoder, the example of variable-length batching.

Token embedding, two encoder layers (multi-head self-attention that ignores
padded keys, a ReLU feed-forward, post-layer-norm residuals) and mean pooling
over the real tokens only, so a padded row gives the same embedding as the
unpadded request (to float rounding). Inputs ``INPUT_IDS`` and
``ATTENTION_MASK`` (INT64, ``[batch, tokens]``), output ``EMBEDDING``
(FP32, ``[batch, DIM]``). Weights come from ``numpy.random.default_rng(seed)``.

:func:`onnx_bytes` exports it with ``torch.onnx.export`` (dynamic batch and
sequence axes); :func:`torchscript_bytes` scripts it for ``pytorch_libtorch``
(forward's arguments are named like the config's inputs). Both take a second.
"""

from __future__ import annotations

import io
import warnings
from typing import Any, cast

import numpy as np
import torch

VOCAB, DIM, HEADS, FF, SEED = 1000, 64, 4, 128, 0


def _weight(rng: np.random.Generator, *shape: int) -> torch.nn.Parameter:
    value = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    return torch.nn.Parameter(torch.from_numpy(value), requires_grad=False)


def _constant(value: float, dim: int) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.full((dim,), value, dtype=torch.float32), requires_grad=False)


class EncoderLayer(torch.nn.Module):
    def __init__(self, rng: np.random.Generator, dim: int, heads: int, ff: int) -> None:
        super().__init__()
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.scale = float(self.head_dim) ** -0.5
        self.wq, self.wk, self.wv, self.wo = (_weight(rng, dim, dim) for _ in range(4))
        self.w1, self.w2 = _weight(rng, dim, ff), _weight(rng, ff, dim)
        self.g1, self.b1, self.g2, self.b2 = _constant(1.0, dim), _constant(0.0, dim), _constant(1.0, dim), _constant(0.0, dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x @ self.wq), self._heads(x @ self.wk), self._heads(x @ self.wv)
        # bias is -1e9 on padded keys, 0 elsewhere: they get no attention (exp underflows to 0).
        scores = (q @ k.transpose(2, 3)) * self.scale + bias
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], self.dim)
        x = torch.nn.functional.layer_norm(x + attended @ self.wo, (self.dim,), self.g1, self.b1)
        return torch.nn.functional.layer_norm(x + torch.relu(x @ self.w1) @ self.w2, (self.dim,), self.g2, self.b2)


class TextEncoder(torch.nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = DIM, heads: int = HEADS, ff: int = FF, seed: int = SEED) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.embedding = torch.nn.Parameter(
            torch.from_numpy(rng.standard_normal((vocab, dim)).astype(np.float32)), requires_grad=False)
        self.layer1 = EncoderLayer(rng, dim, heads, ff)
        self.layer2 = EncoderLayer(rng, dim, heads, ff)

    def forward(self, INPUT_IDS: torch.Tensor, ATTENTION_MASK: torch.Tensor) -> torch.Tensor:  # noqa: N803
        x = self.embedding[INPUT_IDS]
        bias = ((ATTENTION_MASK == 0).to(torch.float32) * -1e9).unsqueeze(1).unsqueeze(2)  # [batch, 1, 1, tokens]
        x = self.layer2(self.layer1(x, bias), bias)
        weights = ATTENTION_MASK.to(torch.float32).unsqueeze(-1)
        return (x * weights).sum(dim=1) / weights.sum(dim=1)


def onnx_bytes(seed: int = SEED) -> bytes:
    model = TextEncoder(seed=seed).eval()
    ids = torch.zeros((2, 5), dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter is deprecated in favour of dynamo's
        torch.onnx.export(  # its stubs say a path; a file object is fine
            model, (ids, torch.ones_like(ids)), cast(Any, buffer), input_names=["INPUT_IDS", "ATTENTION_MASK"],
            output_names=["EMBEDDING"], opset_version=17, dynamo=False,
            dynamic_axes={"INPUT_IDS": axes, "ATTENTION_MASK": axes, "EMBEDDING": {0: "batch"}})
    import onnx

    from inferd.examples.onnx_models import IR_VERSION, serialize

    exported = onnx.load_from_string(buffer.getvalue())
    exported.ir_version = IR_VERSION  # as every example model: one the supported onnxruntime versions read
    return serialize(exported)


def torchscript_bytes(seed: int = SEED) -> bytes:
    from inferd.examples.torch_models import save

    return save(TextEncoder(seed=seed).eval())
