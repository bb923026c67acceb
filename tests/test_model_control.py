"""Issue #7: model control as Triton (none / explicit / poll), reloads under
traffic that drop nothing, failed reloads that keep the old version serving,
memory given back after unloads, and model_warmup."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.examples import onnx_models as om
from repo_builder import add_model, config

SCALE_IO = ([("INPUT0", "TYPE_FP32", [256])], [("OUTPUT0", "TYPE_FP32", [256])])
INT16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def scaler_config(extra: str = "") -> str:
    return config("scaler", *SCALE_IO, max_batch_size=8, extra="dynamic_batching { }\n" + extra)


def add_version(repo: Path, name: str, version: int, data: bytes) -> None:
    """Put ``version`` in place atomically (a poller never sees half a folder)."""
    staging = repo.parent / f".staging-{name}-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "model.onnx").write_bytes(data)
    os.rename(staging, repo / name / str(version))


def scale_model(factor: float) -> bytes:
    return om.serialize(om.scale(factor=factor))


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "scaler", om.scale(factor=1.0), scaler_config())
    add_model(repo, "adder", om.add_sub(), config("adder", INT16, OUT16, 8))
    return repo


def infer_scaler(client, version: str = "") -> tuple[str, float]:
    """(the version that answered, the factor it applied)."""
    x = np.ones((1, 256), dtype=np.float32)
    i = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("scaler", [i], model_version=version)
    return result.get_response().model_version, float(result.as_numpy("OUTPUT0")[0, 0])


def infer_adder(client):
    a = np.ones((1, 16), dtype=np.int32)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer("adder", inputs)


def index(client) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    for m in client.get_model_repository_index().models:
        out.setdefault(m.name, []).append((m.version, m.state, m.reason))
    return out


class Traffic:
    """Client threads sending requests back to back; every answer and failure is kept."""

    def __init__(self, url: str, threads: int = 2) -> None:
        self.stop = threading.Event()
        self.answers: list[list[tuple[str, float]]] = [[] for _ in range(threads)]
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(url, i), daemon=True) for i in range(threads)]

    def _run(self, url: str, i: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        while not self.stop.is_set():
            try:
                self.answers[i].append(infer_scaler(client))
            except Exception as exc:  # every failure counts
                self.failures.append(str(exc))
        client.close()

    def __enter__(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(30)

    def count(self) -> int:
        return sum(len(a) for a in self.answers)

    def wait_for(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        start = self.count()
        while self.count() < start + n and time.monotonic() < deadline:
            time.sleep(0.01)


# -- modes ------------------------------------------------------------------------------------


def test_mode_none_refuses_control(start_server, repo):
    server = start_server(repo)
    client = grpcclient.InferenceServerClient(server.url)
    for call in (lambda: client.load_model("scaler"), lambda: client.unload_model("scaler")):
        with pytest.raises(InferenceServerException) as exc:
            call()
        assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "--model-control-mode explicit" in exc.value.message()
    client.close()


def test_explicit_mode_load_unload_and_index(start_server, repo):
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "scaler"])
    client = grpcclient.InferenceServerClient(server.url)
    assert index(client) == {"scaler": [("1", "READY", "")], "adder": [("", "", "")]}
    assert client.is_server_ready()  # readiness counts what was asked for
    with pytest.raises(InferenceServerException) as exc:
        infer_adder(client)
    assert exc.value.status() == "StatusCode.UNAVAILABLE" and "not loaded" in exc.value.message()

    client.load_model("adder")
    assert index(client)["adder"] == [("1", "READY", "")] and client.is_model_ready("adder")
    np.testing.assert_array_equal(infer_adder(client).as_numpy("OUTPUT0"), np.full((1, 16), 2))

    client.unload_model("adder")
    assert index(client)["adder"] == [("", "UNAVAILABLE", "unloaded")]
    assert not client.is_model_ready("adder") and client.is_server_ready()
    with pytest.raises(InferenceServerException) as exc:
        infer_adder(client)
    assert exc.value.status() == "StatusCode.UNAVAILABLE" and "unloaded" in exc.value.message()

    with pytest.raises(InferenceServerException) as exc:
        client.load_model("no_such_model")
    assert exc.value.status() == "StatusCode.NOT_FOUND" and "no_such_model" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("scaler", files={"file:1/model.onnx": b"xx"}, config="{}")  # not an ONNX file
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert exc.value.message().startswith("failed to load 'scaler': ")  # tests/test_load_overrides.py: the rest

    # A model added to the repository after start-up can be loaded by name.
    add_model(repo, "late", om.add_sub(), config("late", INT16, OUT16, 8))
    client.load_model("late")
    assert index(client)["late"] == [("1", "READY", "")]
    client.close()


def test_load_model_star_and_unknown_startup_model(start_server, repo, tmp_path):
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "*"])
    client = grpcclient.InferenceServerClient(server.url)
    assert {n: v[0][1] for n, v in index(client).items()} == {"scaler": "READY", "adder": "READY"}
    client.close()
    with pytest.raises(RuntimeError, match="--load-model nope: no such model"):
        start_server(repo, ["--model-control-mode", "explicit", "--load-model", "nope"])


def test_load_with_config_override(start_server, repo):
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "scaler"])
    client = grpcclient.InferenceServerClient(server.url)
    assert client.get_model_config("scaler").config.max_batch_size == 8
    override = {"name": "scaler", "platform": "onnxruntime_onnx", "max_batch_size": 2,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [256]}]}
    client.load_model("scaler", config=json.dumps(override))
    assert client.get_model_config("scaler").config.max_batch_size == 2
    assert infer_scaler(client) == ("1", 1.0)
    for bad, code, word in [
        ("{not json", "INVALID_ARGUMENT", "not a valid ModelConfig"),
        (json.dumps({**override, "name": "other"}), "INVALID_ARGUMENT", "'other'"),
        (json.dumps({**override, "max_batch_size": -1}), "INVALID_ARGUMENT", "max_batch_size"),
    ]:
        with pytest.raises(InferenceServerException) as exc:
            client.load_model("scaler", config=bad)
        assert exc.value.status() == f"StatusCode.{code}" and word in exc.value.message()
        assert client.get_model_config("scaler").config.max_batch_size == 2  # still the last good one
    client.load_model("scaler")  # without a config: config.pbtxt again
    assert client.get_model_config("scaler").config.max_batch_size == 8
    client.close()


# -- reloads ---------------------------------------------------------------------------------


def test_reload_new_versions_under_traffic_drops_nothing(start_server, repo):
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "scaler"])
    client = grpcclient.InferenceServerClient(server.url)
    with Traffic(server.url) as traffic:
        traffic.wait_for(50)
        for version in (2, 3):
            add_version(repo, "scaler", version, scale_model(float(version)))
            client.load_model("scaler")
            assert index(client)["scaler"] == [(str(version), "READY", "")]  # latest only: the old one went
            traffic.wait_for(50)
        client.load_model("scaler")  # unchanged: nothing rebuilt, nothing dropped
        traffic.wait_for(50)
    assert traffic.failures == []
    for answers in traffic.answers:
        versions = [int(v) for v, _ in answers]
        assert versions == sorted(versions)  # never back to an older version
        assert {v for v in versions} >= {1, 3}
        assert all(factor == float(v) for v, factor in answers)  # each answer from the version it names
    stats = client.get_inference_statistics("scaler").model_stats
    assert [s.version for s in stats] == ["3"]
    client.close()


def test_failed_reload_keeps_the_old_version_serving(start_server, repo):
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "scaler"])
    client = grpcclient.InferenceServerClient(server.url)
    with Traffic(server.url) as traffic:
        traffic.wait_for(20)
        add_version(repo, "scaler", 2, b"this is not an onnx model")
        with pytest.raises(InferenceServerException) as exc:
            client.load_model("scaler")
        assert "scaler" in exc.value.message() and "version 2" not in index(client)
        traffic.wait_for(20)
        (version, state, reason), = index(client)["scaler"]
        assert (version, state) == ("1", "READY")
        assert "reload failed" in reason and "serving the previous version" in reason
        assert client.is_model_ready("scaler") and client.is_server_ready()
        assert infer_scaler(client) == ("1", 1.0)

        shutil.rmtree(repo / "scaler" / "2")
        add_version(repo, "scaler", 2, scale_model(2.0))
        client.load_model("scaler")
        assert index(client)["scaler"] == [("2", "READY", "")]
        traffic.wait_for(20)
    assert traffic.failures == []
    assert infer_scaler(client) == ("2", 2.0)
    client.close()


def test_all_versions_policy_keeps_unchanged_versions(start_server, repo):
    (repo / "scaler" / "config.pbtxt").write_text(scaler_config("version_policy { all { } }\n"))
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "scaler"])
    client = grpcclient.InferenceServerClient(server.url)
    infer_scaler(client, "1")
    add_version(repo, "scaler", 2, scale_model(2.0))
    client.load_model("scaler")
    assert [v for v, _, _ in index(client)["scaler"]] == ["1", "2"]
    assert infer_scaler(client, "1") == ("1", 1.0) and infer_scaler(client) == ("2", 2.0)
    # Version 1 was kept, not rebuilt: its statistics go on.
    v1 = next(s for s in client.get_inference_statistics("scaler").model_stats if s.version == "1")
    assert v1.inference_stats.success.count == 2
    client.close()


# -- poll mode ---------------------------------------------------------------------------------


def wait_until(check, timeout: float = 60, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except InferenceServerException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {check}")
        time.sleep(interval)


def test_poll_mode_picks_up_changes(start_server, repo):
    server = start_server(repo, ["--model-control-mode", "poll", "--repository-poll-secs", "0.2"])
    client = grpcclient.InferenceServerClient(server.url)
    assert infer_scaler(client) == ("1", 1.0)
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("scaler")
    assert exc.value.status() == "StatusCode.UNIMPLEMENTED" and "polling is enabled" in exc.value.message()

    with Traffic(server.url, threads=1) as traffic:
        add_version(repo, "scaler", 2, scale_model(2.0))  # a new version
        wait_until(lambda: infer_scaler(client) == ("2", 2.0))
        add_version(repo, "scaler", 3, b"broken")  # a broken one: 2 keeps serving, the poller goes on
        wait_until(lambda: "reload failed" in index(client)["scaler"][0][2])
        assert infer_scaler(client) == ("2", 2.0)
        add_model(repo, "late", om.add_sub(), config("late", INT16, OUT16, 8))  # a new model
        wait_until(lambda: index(client).get("late") == [("1", "READY", "")])
        shutil.rmtree(repo / "scaler" / "3")
        add_version(repo, "scaler", 3, scale_model(3.0))  # fixed
        wait_until(lambda: infer_scaler(client) == ("3", 3.0))
        shutil.rmtree(repo / "adder")  # a removed model
        wait_until(lambda: "adder" not in index(client))
    assert traffic.failures == []
    assert {"scaler", "late"} == set(index(client))
    client.close()


# -- unload_dependents ----------------------------------------------------------------------------


def test_unload_dependents_unloads_the_ensembles_that_use_it(start_server, repo):
    add_model(repo, "ens", None, '''name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 256 ] } ]
ensemble_scheduling { step [ { model_name: "scaler" model_version: -1
  input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "Y" } } ] }
''')
    (repo / "ens" / "1").mkdir()
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "ens"])
    client = grpcclient.InferenceServerClient(server.url)
    assert index(client)["ens"][0][1] == "READY" and index(client)["scaler"][0][1] == "READY"  # loaded for ens
    client.unload_model("scaler", unload_dependents=True)
    assert index(client)["ens"] == [("", "UNAVAILABLE", "unloaded")]
    assert index(client)["scaler"] == [("", "UNAVAILABLE", "unloaded")]
    client.close()


# -- memory ------------------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_memory_is_returned_after_unload(start_server, repo):
    """50 load/infer/unload cycles: the second 25 must not keep growing the way a
    leak would (a leak grows both halves alike; warm-up growth is all in the first).

    The heap trimmer is off (INFERD_MALLOC_TRIM_INTERVAL=0): it gives freed pages back every 30 s, on
    its own time, and the next cycle faults them in again, so a trim near the middle of the run (a
    loaded machine makes the run long) moved growth into the second half. Without it the cycles alone
    move the RSS, each reusing what the last one freed."""
    server = start_server(repo, ["--model-control-mode", "explicit"], env={"INFERD_MALLOC_TRIM_INTERVAL": "0"})
    client = grpcclient.InferenceServerClient(server.url)
    pid = server.proc.pid
    samples = []
    for _ in range(50):
        client.load_model("adder")
        infer_adder(client)
        client.unload_model("adder")
        samples.append(rss_bytes(pid))
    client.close()
    first = samples[24] - samples[0]
    second = samples[49] - samples[25]
    print(f"RSS after cycle 1: {samples[0] / 2**20:.1f} MiB, 25: {samples[24] / 2**20:.1f} MiB, "
          f"50: {samples[49] / 2**20:.1f} MiB; growth first half {first / 2**20:+.2f} MiB, "
          f"second half {second / 2**20:+.2f} MiB")
    # One page of allocator noise per cycle at most; a leaking model (its session, its
    # weights) would add far more than that in every cycle.
    assert second <= max(first / 2, 0) + 25 * 4096 * 4, (first, second, samples)


# -- warm-up ---------------------------------------------------------------------------------------------

COUNTER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0
        self.requests = 0
        self.seen = []

    def execute(self, requests):
        self.executions += 1
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == 7).any():
                raise ValueError("seven is not allowed")
            self.requests += 1
            self.seen.append(float(x.sum()))
            out = np.array([[self.executions, self.requests]], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", out),
                pb_utils.Tensor("SEEN", np.array([[sum(self.seen)]], dtype=np.float32))]))
        return responses
'''


def counter_config(name: str, warmup: str) -> str:
    return config(name, [("X", "TYPE_FP32", [4])], [("COUNT", "TYPE_INT64", [2]), ("SEEN", "TYPE_FP32", [1])],
                  max_batch_size=4, platform=None, extra='backend: "python"\n' + warmup)


def add_counter(repo: Path, name: str, warmup: str) -> None:
    add_model(repo, name, None, counter_config(name, warmup))
    (repo / name / "1").mkdir()
    (repo / name / "1" / "model.py").write_text(COUNTER)


def test_model_warmup_runs_before_ready(start_server, tmp_path):
    repo = tmp_path / "repo"
    add_counter(repo, "warm", '''model_warmup [
  { name: "zeros" batch_size: 3 count: 2 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },
  { name: "file" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin" } } },
  { name: "random" batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } }
]
''')
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "x.bin").write_bytes(np.array([1, 2, 3, 4], dtype=np.float32).tobytes())
    add_counter(repo, "bad_file", '''model_warmup [ { name: "short" batch_size: 1
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin" } } } ]
''')
    (repo / "bad_file" / "warmup").mkdir()
    (repo / "bad_file" / "warmup" / "x.bin").write_bytes(b"\0" * 12)
    add_counter(repo, "escapes", '''model_warmup [ { name: "up" batch_size: 1
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "../config.pbtxt" } } } ]
''')
    add_counter(repo, "fails", '''model_warmup [ { name: "sevens" batch_size: 1
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "sevens.bin" } } } ]
''')
    (repo / "fails" / "warmup").mkdir()
    (repo / "fails" / "warmup" / "sevens.bin").write_bytes(np.full(4, 7, dtype=np.float32).tobytes())
    add_counter(repo, "bad_dims", '''model_warmup [ { name: "d" batch_size: 1
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } } ]
''')
    add_counter(repo, "too_big", '''model_warmup [ { name: "big" batch_size: 9
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
''')
    add_counter(repo, "no_data", '''model_warmup [ { name: "none" batch_size: 1
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] } } } ]
''')
    server = start_server(repo)
    client = grpcclient.InferenceServerClient(server.url)
    i = grpcclient.InferInput("X", [1, 4], "FP32")
    i.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    result = client.infer("warm", [i])
    # 2 executions of 3 zero rows, 1 of the file's row, 1 random: 4 executions, 8 requests, then ours.
    assert result.as_numpy("COUNT").tolist() == [[5, 9]]
    seen = float(result.as_numpy("SEEN")[0, 0])
    assert 10.0 < seen < 14.0  # 1+2+3+4 from the file, plus four values in [0, 1)
    states = {m.name: (m.state, m.reason) for m in client.get_model_repository_index().models}
    assert states["warm"] == ("READY", "")
    for name, words in {
        "bad_file": ["model_warmup 'short'", "x.bin", "12 bytes", "need 16"],
        "escapes": ["../config.pbtxt", "inside"],
        "fails": ["warmup sample 'sevens'", "seven is not allowed"],
        "bad_dims": ["model_warmup 'd'", "dims [5]"],
        "too_big": ["batch_size 9", "max_batch_size 4"],
        "no_data": ["zero_data, random_data or input_data_file"],
    }.items():
        state, reason = states[name]
        assert state == "UNAVAILABLE", (name, reason)
        for word in words:
            assert word in reason, (name, reason)
    client.close()


# -- ensembles under model control -------------------------------------------------------------------


def ensemble_text(name: str = "ens", step_model: str = "scaler", max_batch_size: int = 8) -> str:
    return f'''name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 256 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step_model}" model_version: -1
  input_map {{ key: "INPUT0" value: "X" }} output_map {{ key: "OUTPUT0" value: "Y" }} }} ] }}
'''


def add_ensemble(repo: Path, name: str = "ens", step_model: str = "scaler") -> None:
    add_model(repo, name, None, ensemble_text(name, step_model))
    (repo / name / "1").mkdir()


def infer_ens(client) -> float:
    i = grpcclient.InferInput("X", [1, 256], "FP32")
    i.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))
    return float(client.infer("ens", [i]).as_numpy("Y")[0, 0])


def ensemble_json(**changes) -> str:
    doc = {"name": "ens", "platform": "ensemble", "max_batch_size": 8,
           "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [256]}],
           "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [256]}],
           "ensemble_scheduling": {"step": [{"model_name": "scaler", "model_version": -1,
                                             "input_map": {"INPUT0": "X"}, "output_map": {"OUTPUT0": "Y"}}]}}
    doc.update(changes)
    return json.dumps(doc)


def test_ensemble_reload_override_and_failed_reload(start_server, repo):
    add_ensemble(repo)
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "ens"])
    client = grpcclient.InferenceServerClient(server.url)
    assert infer_ens(client) == 1.0

    # An unchanged reload keeps the loaded version: its statistics go on.
    client.load_model("ens")
    assert client.get_inference_statistics("ens").model_stats[0].inference_stats.success.count == 1

    # RepositoryModelLoad's config for an ensemble goes through the ensemble loader.
    client.load_model("ens", config=ensemble_json(max_batch_size=4))
    assert client.get_model_config("ens").config.max_batch_size == 4
    assert infer_ens(client) == 1.0

    # A failed reload (a config override naming a missing model; then a broken config.pbtxt)
    # keeps the previous version serving, as for any model.
    for break_it in (
        lambda: client.load_model("ens", config=ensemble_json(ensemble_scheduling={"step": [
            {"model_name": "nope", "model_version": -1, "input_map": {"INPUT0": "X"},
             "output_map": {"OUTPUT0": "Y"}}]})),
        lambda: ((repo / "ens" / "config.pbtxt").write_text(ensemble_text(step_model="missing")),
                 client.load_model("ens")),
    ):
        with pytest.raises(InferenceServerException) as exc:
            break_it()
        assert "failed to load 'ens'" in exc.value.message()
        (version, state, reason), = index(client)["ens"]
        assert (version, state) == ("1", "READY"), reason
        assert reason.startswith("reload failed, serving the previous version: ")
        assert client.is_model_ready("ens") and client.is_server_ready()
        assert client.get_model_config("ens").config.max_batch_size == 4  # still the last good one
        assert infer_ens(client) == 1.0

    (repo / "ens" / "config.pbtxt").write_text(ensemble_text())
    client.load_model("ens")
    assert index(client)["ens"] == [("1", "READY", "")]
    assert client.get_model_config("ens").config.max_batch_size == 8
    client.close()


# -- start-up load vs RepositoryModelLoad ------------------------------------------------------------------


@pytest.mark.parametrize("first", ["startup", "control"])
async def test_load_during_startup_builds_each_model_once(repo, monkeypatch, first):
    """A RepositoryModelLoad that arrives while start-up loading builds the same model
    waits for it (one per-model lock), then keeps what was built."""
    import asyncio

    from inferd.repository import manager as manager_module

    real = manager_module.build_model
    builds: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def gated_build(spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        builds.append(spec.name)
        started.set()
        assert gate.wait(60)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(manager_module, "build_model", gated_build)
    manager = manager_module.ModelManager([repo], mode="explicit", startup_models=["adder", "scaler"])

    async def until(event: threading.Event) -> None:
        for _ in range(6000):
            if event.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("no build started")

    try:
        if first == "startup":
            startup = asyncio.ensure_future(manager.load_all())
            await until(started)
            control = asyncio.ensure_future(manager.load_model("scaler"))
        else:
            control = asyncio.ensure_future(manager.load_model("scaler"))
            await until(started)
            startup = asyncio.ensure_future(manager.load_all())
        await asyncio.sleep(0.2)  # both are under way
        gate.set()
        await asyncio.gather(startup, control)
        assert sorted(builds) == ["adder", "scaler"]  # each built once
        assert manager.all_ready() and manager.get("scaler").version == 1
        assert {e.name: (e.state, e.reason) for e in manager.index()} == {
            "adder": ("READY", ""), "scaler": ("READY", "")}
    finally:
        gate.set()
        await manager.stop()


async def test_control_load_of_an_unselected_model_during_startup_stays_wanted(repo, monkeypatch):
    """Explicit mode marks the models start-up does not load as not loaded; not one that a
    RepositoryModelLoad is loading at that moment."""
    import asyncio

    from inferd.repository import manager as manager_module

    real = manager_module.build_model
    started, gate = threading.Event(), threading.Event()

    def gated_build(spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        if spec.name == "scaler":
            started.set()
            assert gate.wait(60)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(manager_module, "build_model", gated_build)
    manager = manager_module.ModelManager([repo], mode="explicit", startup_models=["adder"])
    try:
        control = asyncio.ensure_future(manager.load_model("scaler"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        startup = asyncio.ensure_future(manager.load_all())
        # In-process builds are measured one at a time: adder's waits for scaler's, held here until
        # start-up has chosen what it loads (adder's load has begun).
        while "adder" not in manager._entries or not manager._entries["adder"].lock.locked():
            await asyncio.sleep(0.01)
        gate.set()
        await startup
        await control
        assert {e.name: e.state for e in manager.index()} == {"adder": "READY", "scaler": "READY"}
        assert manager._entries["scaler"].wanted  # asked for: it counts for server readiness
    finally:
        gate.set()
        await manager.stop()


# -- poll mode and ensembles -------------------------------------------------------------------------------


async def test_poll_keeps_an_unchanged_ensemble_and_retries_a_failed_one(repo):
    from inferd.repository.control import RepositoryPoller
    from inferd.repository.manager import ModelManager

    add_ensemble(repo, "ens", "scaler")
    add_ensemble(repo, "waits", "late")  # its composing model is not there yet
    manager = ModelManager([repo], mode="poll")
    poller = RepositoryPoller(manager, 3600)
    try:
        await manager.load_all()
        ens = manager.get("ens")
        states = {e.name: e.state for e in manager.index()}
        assert states["ens"] == "READY" and states["waits"] == "UNAVAILABLE"
        await poller.poll()
        await poller.poll()
        assert manager.get("ens") is ens  # not rebuilt at every poll: its statistics go on
        add_model(repo, "late", om.scale(factor=3.0), config("late", *SCALE_IO, max_batch_size=8))
        await poller.poll()  # loads 'late'; 'waits' may come before it in this scan
        await poller.poll()
        assert {e.name: e.state for e in manager.index()}["waits"] == "READY"
        (repo / "ens" / "config.pbtxt").write_text(ensemble_text("ens", "late"))  # a changed ensemble reloads
        await poller.poll()
        assert manager.get("ens") is not ens and manager.get("ens").spec.config.ensemble_scheduling.step[0].model_name == "late"
    finally:
        await manager.stop()
