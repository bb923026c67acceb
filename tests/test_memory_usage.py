"""ModelStatistics' ``memory_usage`` in every model control mode, through tritonclient: here the default
(``none``, every model loaded at start-up), with a model in the server's process (an ONNX table of a
known size) and one in a model host (a Python model holding a known number of bytes). Both process
modes (`make test`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ServerProcess, running  # noqa: E402
from repo_builder import add_python_model  # noqa: E402

from inferd.examples.many_models import add_table_model  # noqa: E402

MiB = 2**20
FLOATS = 2_000_000  # an 8 MB table
HELD = 64 * MiB

HOLDER = f'''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.held = np.ones({HELD} // 8)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.get_input_tensor_by_name(r, "I")])
                for r in requests]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("memory_usage")
    add_table_model(root, "table", 1, FLOATS)
    add_python_model(root, "holder", HOLDER, '''
        name: "holder"
        backend: "python"
        max_batch_size: 0
        input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]
        output [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]
    ''')
    with running(root) as s:
        yield s


def held(client: grpcclient.InferenceServerClient, model: str) -> int:
    (stats,) = client.get_inference_statistics(model).model_stats
    usage = {(u.type, u.id): u.byte_size for u in stats.memory_usage}
    assert list(usage) == [("CPU", 0)], usage
    return usage[("CPU", 0)]


def test_an_in_process_model_reports_what_its_load_holds(client) -> None:  # type: ignore[no-untyped-def]
    size = held(client, "table")
    weights = FLOATS * 4
    assert weights <= size <= weights + 2 * MiB, size / MiB  # its table, and its session's first arena chunk


def test_a_hosted_model_reports_its_hosts_own_memory(client) -> None:  # type: ignore[no-untyped-def]
    size = held(client, "holder")
    # What it holds and its host's own pages (~10 MiB here): not its RSS (~42 MiB more here), most of
    # which is the zygote's interpreter and libraries, shared by every host and held once.
    assert HELD <= size <= HELD + 24 * MiB, size / MiB
