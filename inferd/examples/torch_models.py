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


class _Block(torch.nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, and the shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        if stride != 1 or c_in != c_out:
            self.shortcut: torch.nn.Module = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                                           nn.BatchNorm2d(c_out))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(torch.nn.Module):
    """A small ResNet-style classifier: a 3x3 stem, three stages of basic blocks
    (``width``, 2x, 4x channels; each later stage halves the resolution), global
    average pooling and a linear head."""

    def __init__(self, width: int, blocks: int, classes: int) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers = []
        c_in = width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks):
                layers.append(_Block(c_in, c_out, 2 if stage > 0 and b == 0 else 1))
                c_in = c_out
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet_module(width: int = 16, blocks: int = 2, classes: int = 10, half: bool = False,
                  seed: int = 0) -> torch.jit.ScriptModule:
    """:class:`ResNet` with weights from ``numpy.random.default_rng(seed)`` (variance-preserving,
    so FP16 activations stay in range), scripted and frozen (batch norm folded into the
    convolutions, as an exported serving model would be)."""
    rng = np.random.default_rng(seed)
    model = ResNet(width, blocks, classes).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) / np.sqrt(fan_in)).astype(np.float32)))
            elif name.endswith("bias"):
                p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) * 0.01).astype(np.float32)))
    if half:
        model = model.half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.freeze(torch.jit.script(model))


def resnet(width: int = 16, blocks: int = 2, classes: int = 10, half: bool = False, seed: int = 0) -> bytes:
    """:func:`resnet_module` as ``torch.jit.save`` bytes (input ``images``: N x 3 x H x W)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(resnet_module(width, blocks, classes, half, seed), buffer)
    return buffer.getvalue()
