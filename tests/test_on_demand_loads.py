"""``--model-control-mode on_demand`` with loads side by side, through tritonclient: first requests to two
cold models load them in parallel (their ``initialize`` both under way at once, counted, not timed); a
model whose files fit the budget but whose measured footprint does not is refused RESOURCE_EXHAUSTED
naming the model, its footprint, the budget and the flag, at once and on every later request, in a host
and in the server's process, and the models' memory stays within the budget. One server for the module
(both process modes: `make test`)."""

from __future__ import annotations

import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ServerProcess, running  # noqa: E402
from gated_model import add_gated_model, loading_count, release  # noqa: E402
from repo_builder import add_python_model  # noqa: E402

MiB = 2**20
BUDGET = 192 * MiB
HOG = 256 * MiB  # what the hog models allocate in initialize: past the whole budget, their files a few KB

# Holds HOG_BYTES of touched memory from initialize on: its footprint, not its files.
HOG_SOURCE = '''
import numpy as np
import triton_python_backend_utils as pb_utils

HOG_BYTES = {hog}


class TritonPythonModel:
    def initialize(self, args):
        self.held = np.ones(HOG_BYTES // 8)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "I").as_numpy().astype(np.float32))])
            for r in requests]
'''

HOG_CONFIG = '''
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "I" data_type: TYPE_INT64 dims: [ 1 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''

INLINE = 'parameters { key: "inferd.host" value: { string_value: "inline" } }\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("on_demand_loads")
    gate = root.parent / (root.name + "-gate")
    for name in ("held_a", "held_b"):  # Python models: in model hosts (the default), held in initialize
        add_gated_model(root, name, gate, hold_load=True, dims=(1,))
    source = HOG_SOURCE.format(hog=HOG)
    add_python_model(root, "hog", source, HOG_CONFIG.format(name="hog"))
    add_python_model(root, "hog_inline", source, HOG_CONFIG.format(name="hog_inline") + INLINE)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with running(repo, extra_args=["--model-control-mode", "on_demand", "--model-memory-budget", str(BUDGET)]) as s:
        yield s


def scrape(server: ServerProcess) -> dict[tuple[str, str], float]:
    """(family, model label or "") -> value, for the inferd_model_* families."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    return {(m.group(1), m.group(2) or ""): float(m.group(3))
            for m in re.finditer(r'^(inferd_model_\w+?)(?:\{model="([^"]*)"\})? (\S+)$', text, re.MULTILINE)}


def test_first_requests_to_two_cold_models_load_them_in_parallel(server: ServerProcess, repo: Path) -> None:
    gate = repo.parent / (repo.name + "-gate")
    results: dict[str, object] = {}

    def one(name: str, value: float) -> None:
        c = grpcclient.InferenceServerClient(server.url)
        try:
            x = grpcclient.InferInput("INPUT0", [1], "FP32")
            x.set_data_from_numpy(np.array([value], dtype=np.float32))
            results[name] = float(c.infer(name, [x], client_timeout=120).as_numpy("OUTPUT0")[0])
        except InferenceServerException as exc:
            results[name] = exc
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(name, float(i))) for i, name in enumerate(("held_a", "held_b"))]
    for t in threads:
        t.start()
    try:
        # Both initializes run at once: the second load did not wait for the first (before, loads ran one
        # at a time and the second began only once the gate let the first end).
        deadline = time.monotonic() + 60
        while loading_count(gate) < 2:
            assert time.monotonic() < deadline, f"{loading_count(gate)} of 2 loads under way"
            time.sleep(0.02)
    finally:
        release(gate, "loaded")
        release(gate)
        for t in threads:
            t.join(120)
    assert results == {"held_a": 0.0, "held_b": 1.0}
    metrics = scrape(server)
    assert metrics[("inferd_model_loads_total", "held_a")] == metrics[("inferd_model_loads_total", "held_b")] == 1


@pytest.mark.parametrize("name", ["hog", "hog_inline"])
def test_a_model_measured_past_the_budget_is_refused_now_and_later(server: ServerProcess, client, name: str) -> None:  # type: ignore[no-untyped-def]
    x = grpcclient.InferInput("I", [1], "INT64")
    x.set_data_from_numpy(np.array([3], dtype=np.int64))
    for attempt in range(3):
        with pytest.raises(InferenceServerException) as info:
            client.infer(name, [x], client_timeout=120)
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED", info.value.message()
        message = info.value.message()
        match = re.search(rf"model '{name}' needs ([\d.]+) MiB \(its footprint, measured at its load\), more than "
                          rf"the whole model memory budget of {BUDGET / MiB:.1f} MiB; raise --model-memory-budget",
                          message)
        assert match, message
        assert float(match.group(1)) * MiB >= HOG  # measured: its files are a few KB
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index[name].state == "UNAVAILABLE" and index[name].reason.startswith("refused: "), index[name]
    metrics = scrape(server)
    assert metrics[("inferd_model_loads_total", name)] == 1  # refused at once after its one load
    assert metrics[("inferd_model_load_refusals_total", name)] == 3
    assert metrics[("inferd_model_memory_used_bytes", "")] <= BUDGET
