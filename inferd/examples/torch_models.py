"""Deterministic TorchScript example/test models.

Each builder returns the bytes of a ``torch.jit.save`` archive of a
``torch.jit.script``-ed module. Weights come from
``numpy.random.default_rng(seed)`` (not torch's generator), so the same
arguments give the same weights on every platform and torch version, and
the same bytes for a given torch version and checkout.

Naming, as Triton's pytorch backend reads it:

- :func:`add_sub` follows the ``INPUT__0``/``OUTPUT__0`` index convention
  (its forward arguments are named ``a``/``b``; config names pick them by index);
- :func:`mlp` takes its input by forward's argument name (``features``) and
  returns ``(logits, probabilities)``, whose config names (not following the
  convention) map by the config's order.
"""

from __future__ import annotations

import io
import warnings
from typing import List, Tuple

import numpy as np
import torch


class AddSub(torch.nn.Module):
    """``(a + b, a - b)`` for any numeric type TorchScript adds."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Identity(torch.nn.Module):
    """Returns its input unchanged, whatever its type."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class StringAddSub(torch.nn.Module):
    """Triton's QA string models (gen_qa_models.py): integers written as text in
    ``List[str]``, their sum and difference back as text."""

    def forward(self, INPUT0: List[str], INPUT1: List[str]) -> Tuple[List[str], List[str]]:
        a = torch.tensor([int(v) for v in INPUT0])
        b = torch.tensor([int(v) for v in INPUT1])
        return [str(v.item()) for v in a + b], [str(v.item()) for v in a - b]


class StringToTensor(torch.nn.Module):
    """Text in, one text and one INT32 tensor out (the QA models' mixed case)."""

    def forward(self, INPUT0: List[str], INPUT1: List[str]) -> Tuple[List[str], torch.Tensor]:
        a = torch.tensor([int(v) for v in INPUT0])
        b = torch.tensor([int(v) for v in INPUT1])
        return [str(v.item()) for v in a + b], (a - b).to(torch.int32)


class TensorToString(torch.nn.Module):
    """Tensors in, ``List[str]`` alone out: forward returns a list, not a tuple."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> List[str]:
        return [str(v.item()) for v in (INPUT0 + INPUT1).reshape(-1)]


class Upper(torch.nn.Module):
    """Each string upper-cased: text through untouched by numbers (UTF-8 round trip)."""

    def forward(self, TEXT: List[str]) -> List[str]:
        return [t.upper() for t in TEXT]


class MLP(torch.nn.Module):
    """``features -> relu(features @ w1 + b1) @ w2 + b2`` and its softmax."""

    def __init__(self, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.from_numpy(w1), requires_grad=False)
        self.b1 = torch.nn.Parameter(torch.from_numpy(b1), requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.from_numpy(w2), requires_grad=False)
        self.b2 = torch.nn.Parameter(torch.from_numpy(b2), requires_grad=False)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(features @ self.w1 + self.b1)
        logits = hidden @ self.w2 + self.b2
        return logits, torch.softmax(logits, dim=-1)


def save(module: torch.nn.Module) -> bytes:
    """``torch.jit.script`` then ``torch.jit.save`` into bytes."""
    with warnings.catch_warnings():
        # torch >= 2.10 marks TorchScript deprecated; Triton's pytorch_libtorch still serves it.
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(module)
        buffer = io.BytesIO()
        torch.jit.save(scripted, buffer)
    return buffer.getvalue()


def add_sub() -> bytes:
    return save(AddSub())


def identity() -> bytes:
    return save(Identity())


def string_add_sub() -> bytes:
    return save(StringAddSub())


def string_to_tensor() -> bytes:
    return save(StringToTensor())


def tensor_to_string() -> bytes:
    return save(TensorToString())


def upper() -> bytes:
    return save(Upper())


def mlp_weights(d_in: int, hidden: int, d_out: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)).astype(np.float32)
    b2 = (rng.standard_normal(d_out) * 0.01).astype(np.float32)
    return w1, b1, w2, b2


def mlp_reference(features: np.ndarray, weights: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`mlp` computes, in numpy (for tests)."""
    w1, b1, w2, b2 = weights
    hidden = np.maximum(features @ w1 + b1, 0)
    logits = hidden @ w2 + b2
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return logits, e / e.sum(axis=-1, keepdims=True)


def mlp(d_in: int = 16, hidden: int = 32, d_out: int = 4, seed: int = 0) -> bytes:
    return save(MLP(*mlp_weights(d_in, hidden, d_out, seed)))
