"""Which models ``--model-host auto`` puts in model hosts (inferd/hosts/registry.py ``Hosts.hosted``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferd.config import KIND_CPU, KIND_GPU
from inferd.hosts.registry import HOST_AT_BYTES, Hosts

LARGE, SMALL = HOST_AT_BYTES, HOST_AT_BYTES - 1


def _spec(kind: str = KIND_CPU, host: str = "") -> SimpleNamespace:
    return SimpleNamespace(params=SimpleNamespace(host=host), instance_groups=(SimpleNamespace(kind=kind),))


def _backend(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name)


@pytest.mark.parametrize("budgeted, backend, size, kind, hosted", [
    (False, "python", 0, KIND_CPU, True),  # Python models: always
    (False, "onnxruntime", LARGE, KIND_CPU, False),  # no budget: ONNX Runtime in the core
    (True, "onnxruntime", LARGE, KIND_CPU, True),  # under a budget, from HOST_AT_BYTES up
    (True, "onnxruntime", SMALL, KIND_CPU, False),  # a host's own ~10 MiB: more than twice the model
    (True, "onnxruntime", LARGE, KIND_GPU, False),  # a CUDA context per host: GPU models stay
    (True, "pytorch", LARGE, KIND_CPU, False),  # a host would import torch itself
])
def test_auto(budgeted: bool, backend: str, size: int, kind: str, hosted: bool) -> None:
    assert Hosts("auto", budgeted=budgeted).hosted(_spec(kind), _backend(backend), size) is hosted


def test_the_model_and_the_flag_override_auto() -> None:
    budgeted = Hosts("auto", budgeted=True)
    assert budgeted.hosted(_spec(host="inline"), _backend("onnxruntime"), LARGE) is False
    assert Hosts("auto").hosted(_spec(host="process"), _backend("onnxruntime"), 0) is True
    assert Hosts("inline", budgeted=True).hosted(_spec(), _backend("onnxruntime"), LARGE) is False
    assert Hosts("process").hosted(_spec(), _backend("pytorch"), 0) is True
