"""``--model-control-mode on_demand`` through tritonclient, what goes wrong: a Python model's BLS call into a
model that is not loaded loads it, from ``execute`` and, in a model host, from ``initialize`` (loads run in
parallel); a model in the server's process whose ``initialize`` BLS-calls a cold model (that load would wait
for its own measured build) fails at once with both models named; a broken model is not loaded again on every request
(its failure is remembered until a backoff passes or its files change); ``--model-gpu-memory-budget``'s
refusals at start-up and its help. One server for the module (both process modes: `make test`)."""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ServerProcess, running  # noqa: E402
from repo_builder import add_python_model  # noqa: E402

from inferd.examples.many_models import add_table_model, expected  # noqa: E402

TABLE_IO = '''
    max_batch_size: 0
    input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# Y = callee(I) through a BLS call from execute.
BLS_CALLER = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="callee", requested_output_names=["Y"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "I")])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message())))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy())]))
        return responses
'''

# initialize BLS-calls 'cold_callee' (not loaded): its own load would have to wait for this one.
CALLS_IN_INITIALIZE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        call = pb_utils.InferenceRequest(model_name="cold_callee", requested_output_names=["Y"],
                                         inputs=[pb_utils.Tensor("I", np.array([1], dtype=np.int64))])
        answer = call.exec()
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        self.y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", self.y)]) for _ in requests]
'''


INLINE = 'parameters { key: "inferd.host" value: { string_value: "inline" } }\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("on_demand_robust")
    add_table_model(root, "callee", 3, 100)
    add_table_model(root, "cold_callee", 4, 100)
    add_python_model(root, "bls_caller", BLS_CALLER, 'name: "bls_caller"\nbackend: "python"\n' + TABLE_IO)
    add_python_model(root, "calls_in_initialize", CALLS_IN_INITIALIZE,
                     'name: "calls_in_initialize"\nbackend: "python"\n' + TABLE_IO)
    add_table_model(root, "cold_callee2", 6, 100)
    add_python_model(root, "inline_calls_in_initialize", CALLS_IN_INITIALIZE.replace("cold_callee", "cold_callee2"),
                     'name: "inline_calls_in_initialize"\nbackend: "python"\n' + TABLE_IO + INLINE)
    broken = add_table_model(root, "broken", 5, 100)
    good = (broken / "1" / "model.onnx").read_bytes()
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx file")
    (root.parent / (root.name + "-good.onnx")).write_bytes(good)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with running(repo, extra_args=["--model-control-mode", "on_demand"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def ask(client: grpcclient.InferenceServerClient, model: str, i: int) -> float:
    x = grpcclient.InferInput("I", [1], "INT64")
    x.set_data_from_numpy(np.array([i], dtype=np.int64))
    return float(client.infer(model, [x], client_timeout=60).as_numpy("Y")[0])


def states(client: grpcclient.InferenceServerClient) -> dict[str, str]:
    return {m.name: m.state for m in client.get_model_repository_index().models}


def counter(server: ServerProcess, family: str, model: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf'^{family}\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_a_bls_call_into_a_cold_model_loads_it(client) -> None:  # type: ignore[no-untyped-def]
    assert states(client)["callee"] == "UNAVAILABLE"
    assert ask(client, "bls_caller", 7) == expected(3, 7)
    assert states(client)["callee"] == "READY"
    assert ask(client, "bls_caller", 8) == expected(3, 8)  # and now it is found loaded


def test_a_hosted_models_bls_call_from_initialize_into_a_cold_model_loads_it(client) -> None:  # type: ignore[no-untyped-def]
    assert states(client)["cold_callee"] == "UNAVAILABLE"
    # Its initialize waits for cold_callee's load, which runs beside its own (before: refused, as loads ran
    # one at a time and that load would have waited for this one).
    assert ask(client, "calls_in_initialize", 1) == expected(4, 1)
    assert states(client)["cold_callee"] == "READY"


def test_an_in_process_models_bls_call_from_initialize_into_a_cold_model_fails_fast_naming_both(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as info:
        ask(client, "inline_calls_in_initialize", 1)  # bounded: client_timeout; a deadlock would hit it
    message = info.value.message()
    assert "model 'inline_calls_in_initialize' failed to load on demand" in message, message
    assert ("model 'inline_calls_in_initialize' made a BLS call to model 'cold_callee2' while "
            "'inline_calls_in_initialize' itself was loading") in message, message
    assert "load 'cold_callee2' first" in message and "inferd.host: process" in message
    assert states(client)["cold_callee2"] == "UNAVAILABLE"  # nothing loaded it
    assert ask(client, "cold_callee2", 2) == expected(6, 2)  # the server goes on; a direct request loads it


def test_a_broken_model_is_not_loaded_again_on_every_request(server: ServerProcess, client, repo: Path) -> None:  # type: ignore[no-untyped-def]
    answers: list[InferenceServerException] = []
    for _ in range(12):  # back to back: the backoff (1 s, doubling) remembers the failure for most of them
        with pytest.raises(InferenceServerException) as info:
            ask(client, "broken", 0)
        answers.append(info.value)
    assert len({a.status() for a in answers}) == 1  # the remembered answer has the load failure's own status
    loads = [a for a in answers if "failed to load on demand:" in a.message()]
    remembered = [a for a in answers if re.search(r"failed to load on demand [\d.]+ s ago", a.message())]
    assert len(loads) + len(remembered) == len(answers) and loads and remembered, [a.message() for a in answers]
    assert "or as soon as its files change or RepositoryModelLoad asks for it" in remembered[0].message()
    assert counter(server, "inferd_model_load_failures_total", "broken") == len(loads)
    assert counter(server, "inferd_model_load_backoffs_total", "broken") == len(remembered)
    # Its files change: the next request loads it, whatever is left of the backoff.
    (repo / "broken" / "1" / "model.onnx").write_bytes((repo.parent / (repo.name + "-good.onnx")).read_bytes())
    assert ask(client, "broken", 6) == expected(5, 6)


@pytest.mark.parametrize("args,words", [
    (["--model-gpu-memory-budget", "0:1GiB"], "--model-gpu-memory-budget needs --model-control-mode on_demand"),
    (["--model-control-mode", "on_demand", "--model-gpu-memory-budget", "0=1GiB"],
     "--model-gpu-memory-budget takes GPU:SIZE items such as 0:8GiB,1:4GiB (a GPU index, a colon, a size), "
     "got '0=1GiB'"),
    (["--model-control-mode", "on_demand", "--model-gpu-memory-budget", "0:1G", "--model-gpu-memory-budget", "0:2G"],
     "gives GPU 0 twice")])
def test_serve_refuses_a_bad_gpu_budget_before_starting(repo: Path, args: list[str], words: str) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_serve_help_documents_the_gpu_budget() -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "inferd.cli", "serve", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert "--model-gpu-memory-budget GPU:SIZE[,GPU:SIZE]" in done.stdout and "0:8GiB,1:4GiB" in done.stdout
