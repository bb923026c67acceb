"""A Python-backend identity model that the test holds open: deterministic in-flight
requests and slow loads, without timing guesses.

``execute`` touches ``<gate>/started.<n>`` and waits for ``<gate>/release`` (then
answers OUTPUT0 = INPUT0); with ``hold_load``, ``initialize`` waits for
``<gate>/loaded`` first. Waits give up after 120 s.
"""

from __future__ import annotations

import time
from pathlib import Path

from repo_builder import add_model, config

_SOURCE = '''
import itertools
import os
import time

import triton_python_backend_utils as pb_utils

GATE = {gate!r}
HOLD_LOAD = {hold_load!r}
_count = itertools.count()


def _wait(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


class TritonPythonModel:
    def initialize(self, args):
        if HOLD_LOAD:
            _wait(os.path.join(GATE, "loaded"))

    def execute(self, requests):
        open(os.path.join(GATE, "started.%d" % next(_count)), "w").close()
        _wait(os.path.join(GATE, "release"))
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''


def add_gated_model(repo: Path, name: str, gate: Path, hold_load: bool = False) -> None:
    """INPUT0 -> OUTPUT0, FP32 [-1], no batching, one instance."""
    gate.mkdir(parents=True, exist_ok=True)
    text = config(name, [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0, platform=None,
                  extra='backend: "python"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n')
    source = _SOURCE.format(gate=str(gate), hold_load=hold_load).encode()
    add_model(repo, name, source, text, filename="model.py")


def release(gate: Path, what: str = "release") -> None:
    (gate / what).touch()


def wait_started(gate: Path, count: int = 1, timeout: float = 60) -> None:
    """Until ``count`` executions have begun."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(gate.glob("started.*"))) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} executions did not start within {timeout}s")
