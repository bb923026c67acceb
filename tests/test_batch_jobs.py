"""Batch jobs over HTTP (POST /v2/batches) and the CLI, on real servers: status and
results, bad input, a restart (SIGKILL) in the middle of a job, cancellation,
and a job running between interactive requests."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, ServerProcess
from inferd.examples.build import build_repository
from repo_builder import add_model

WAIT = 120

# Sleeps 20 ms per request: a job of a few hundred lines is still running when the test kills the server.
SLOW = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]) for r in requests]
'''
SLOW_CONFIG = '''name: "slow"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
'''


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def simple_lines(n: int, start: int = 0) -> bytes:
    out = []
    for i in range(start, start + n):
        row = [i % 100] * 16
        out.append(json.dumps({"custom_id": f"row-{i}", "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": row},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}))
    return ("\n".join(out) + "\n").encode()


def slow_lines(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"s{i}", "inputs": [
        {"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [float(i)]}]}) + "\n" for i in range(n)).encode()


class Batches:
    def __init__(self, server: ServerProcess) -> None:
        self.base = f"http://{server.http_url}/v2/batches"

    def submit(self, data: bytes, model: str) -> dict[str, Any]:
        code, body = http("POST", f"{self.base}?model={model}", data)
        assert code == 200, body
        return json.loads(body)

    def get(self, job_id: str) -> dict[str, Any]:
        code, body = http("GET", f"{self.base}/{job_id}")
        assert code == 200, body
        return json.loads(body)

    def wait(self, job_id: str, until=lambda doc: doc["status"] in ("completed", "cancelled", "failed")) -> dict:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            doc = self.get(job_id)
            if until(doc):
                return doc
            time.sleep(0.05)
        raise AssertionError(f"batch job {job_id} did not get there: {doc}")

    def results(self, job_id: str, fmt: str = "") -> bytes:
        code, body = http("GET", f"{self.base}/{job_id}/results" + (f"?format={fmt}" if fmt else ""))
        assert code == 200, body
        return body


def result_lines(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batchjobs")
    build_repository(root, only=["simple"], log=None)
    add_model(root, "slow", SLOW.encode(), SLOW_CONFIG, filename="model.py")
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(repo, ["--batch-dir", str(tmp_path_factory.mktemp("batch-dir"))])
    yield s
    s.stop()


def test_a_job_runs_and_every_custom_id_has_its_result(server):
    batches = Batches(server)
    job = batches.submit(simple_lines(50), "simple")
    assert job["status"] in ("queued", "running") and job["request_counts"]["total"] == 50
    done = batches.wait(job["id"])
    assert done["status"] == "completed" and done["request_counts"] == {
        "total": 50, "completed": 50, "succeeded": 50, "failed": 0}
    results = result_lines(batches.results(job["id"]))
    assert sorted(r["custom_id"] for r in results) == sorted(f"row-{i}" for i in range(50))
    by_id = {r["custom_id"]: r for r in results}
    out = {t["name"]: t for t in by_id["row-7"]["outputs"]}
    assert out["OUTPUT0"]["data"] == [8] * 16 and out["OUTPUT1"]["data"] == [6] * 16
    assert out["OUTPUT0"]["shape"] == [1, 16] and by_id["row-7"]["model_version"] == "1"
    with np.load(io.BytesIO(batches.results(job["id"], "npz"))) as npz:
        np.testing.assert_array_equal(npz["row-7/OUTPUT0"], np.full((1, 16), 8, np.int32))
    listed = json.loads(http("GET", batches.base)[1])["batches"]
    assert job["id"] in [j["id"] for j in listed]


def test_a_line_the_model_refuses_is_that_line_s_error(server):
    batches = Batches(server)
    bad = json.dumps({"custom_id": "bad", "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}]}).encode() + b"\n"
    done = batches.wait(batches.submit(simple_lines(2) + bad, "simple")["id"])
    assert done["request_counts"]["failed"] == 1 and done["request_counts"]["succeeded"] == 2
    errors = [r for r in result_lines(batches.results(done["id"])) if "error" in r]
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert "INPUT0" in errors[0]["error"]["message"] and errors[0]["error"]["type"] == "InvalidArgument"


@pytest.mark.parametrize("url, body, code, words", [
    ("?model=simple", b'{"inputs": []}\n', 400, ["line 1", "custom_id"]),
    ("?model=nope", b"", 404, ["nope"]),
    ("", b"", 400, ["model"]),
    ("?model=simple&model_version=x", b"", 400, ["version string 'x'", "a version is a non-negative integer"]),
])
def test_bad_submissions_are_refused(server, url, body, code, words):
    status, text = http("POST", f"http://{server.http_url}/v2/batches{url}", body or simple_lines(1))
    assert status == code, text
    for word in words:
        assert word in json.loads(text)["error"]


def test_unknown_job_is_not_found(server):
    assert http("GET", f"http://{server.http_url}/v2/batches/batch_nope")[0] == 404
    assert http("POST", f"http://{server.http_url}/v2/batches/batch_nope/cancel")[0] == 404


def test_cancel_keeps_the_results_so_far(server):
    batches = Batches(server)
    job = batches.submit(slow_lines(400), "slow")
    batches.wait(job["id"], lambda d: d["request_counts"]["completed"] >= 4)
    code, body = http("POST", f"{batches.base}/{job['id']}/cancel")
    assert code == 200 and json.loads(body)["status"] == "cancelled"
    after = batches.get(job["id"])
    time.sleep(0.2)
    assert batches.get(job["id"])["request_counts"] == after["request_counts"]  # nothing more runs
    ids = [r["custom_id"] for r in result_lines(batches.results(job["id"]))]
    assert len(ids) == after["request_counts"]["completed"] < 400 and len(set(ids)) == len(ids)


def test_a_job_survives_a_killed_server_and_each_custom_id_has_one_result(repo, tmp_path):
    batch_dir = tmp_path / "batches"
    first = ServerProcess(repo, ["--batch-dir", str(batch_dir)])
    try:
        batches = Batches(first)
        job = batches.submit(slow_lines(300), "slow")
        part = batches.wait(job["id"], lambda d: d["request_counts"]["completed"] >= 40)
        first.stop(signal.SIGKILL)  # no chance to tidy up
    finally:
        first.stop()
    assert part["request_counts"]["completed"] < 300
    second = ServerProcess(repo, ["--batch-dir", str(batch_dir)])
    try:
        batches = Batches(second)
        done = batches.wait(job["id"])
        results = result_lines(batches.results(job["id"]))
    finally:
        second.stop()
    assert done["status"] == "completed" and done["request_counts"]["succeeded"] == 300
    ids = [r["custom_id"] for r in results]
    assert len(ids) == 300 and set(ids) == {f"s{i}" for i in range(300)}
    assert all(r["outputs"][0]["data"] == [2.0 * int(r["custom_id"][1:])] for r in results)


def interactive_calls(url: str, count: int, pause_s: float = 0.005) -> None:
    """``count`` sequential requests with a pause between them (an interactive user)."""
    client = grpcclient.InferenceServerClient(url)
    a = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(np.ones((1, 16), np.int32))
    b = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    b.set_data_from_numpy(np.ones((1, 16), np.int32))
    for _ in range(count):
        client.infer("simple", [a, b])
        time.sleep(pause_s)
    client.close()


def test_a_job_runs_between_interactive_requests_and_never_over_them(server):
    """What keeps interactive latency: the job's lines take the model only while no interactive
    request is in flight (the lane's own count), and still make progress in the pauses. How much
    latency that costs is a benchmark's figure, not a test's (it depends on the machine's load)."""
    batches = Batches(server)
    progress, accounting = [], []
    for _ in range(3):
        job = batches.submit(simple_lines(3000), "simple")
        start = batches.wait(job["id"], lambda d: d["request_counts"]["completed"] > 0)
        interactive_calls(server.url, 40)
        during = batches.get(job["id"])
        http("POST", f"{batches.base}/{job['id']}/cancel")
        progress.append(during["request_counts"]["completed"] - start["request_counts"]["completed"])
        accounting.append(during["scheduling"])
    # The job did run between the interactive requests...
    assert all(p > 0 for p in progress), progress
    # ...but never took the model while interactive work was in flight.
    assert all(a["admitted_over_interactive"] == 0 for a in accounting), accounting


def test_cli_batch_run_in_process_resumes_and_writes_parquet(repo, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    first_part, everything = tmp_path / "first.jsonl", tmp_path / "all.jsonl"
    first_part.write_bytes(simple_lines(10))
    everything.write_bytes(simple_lines(30))
    out = tmp_path / "out"

    def run(requests: Path) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "inferd.cli", "batch", "run", str(requests), "-m", "simple",
               "--model-repository", str(repo), "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        return done

    assert "10/10" in run(first_part).stderr  # tqdm's count
    resumed = run(everything)  # the same output: the first ten are not run again
    assert "resuming: 10 of 30 requests already have results" in resumed.stderr and "20/20" in resumed.stderr
    assert "req/s" in resumed.stderr and "<" in resumed.stderr  # tqdm's rate, and elapsed<remaining
    table = pq.read_table(out).to_pylist()
    assert sorted(r["custom_id"] for r in table) == sorted(f"row-{i}" for i in range(30))
    assert next(r for r in table if r["custom_id"] == "row-3")["OUTPUT0"] == [4] * 16
    assert "nothing to do: all 30 requests have results" in run(everything).stderr
    assert len(pq.read_table(out)) == 30


def test_cli_batch_submit_status_and_results(server, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(simple_lines(5))
    base = [sys.executable, "-m", "inferd.cli", "batch"]
    url = ["--url", server.http_url]
    submitted = subprocess.run([*base, "submit", str(requests), "-m", "simple", *url], capture_output=True,
                               text=True, timeout=WAIT, cwd=ROOT)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    Batches(server).wait(job_id)
    status = subprocess.run([*base, "status", job_id, *url], capture_output=True, text=True, timeout=WAIT, cwd=ROOT)
    assert json.loads(status.stdout)["status"] == "completed"
    out = tmp_path / "results.jsonl"
    fetched = subprocess.run([*base, "results", job_id, "-o", str(out), *url], capture_output=True, text=True,
                             timeout=WAIT, cwd=ROOT)
    assert fetched.returncode == 0, fetched.stderr
    assert len(result_lines(out.read_bytes())) == 5
