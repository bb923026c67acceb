"""Issue 16, items 5 and 6 (and item 4's size limits): TLS and mutual TLS on both ports with Triton's
flags and tritonclient's own SSL options; restricted endpoint groups (Triton's
``--grpc-restricted-protocol`` / ``--http-restricted-api``); shared-memory keys and config file names
that cannot lead outside /dev/shm or the model's folder; message-size limits on both protocols.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from certs import Certs, make_certs
from repo_builder import add_model, config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inferd.examples import onnx_models as om

    repo = tmp_path_factory.mktemp("secure_repo")
    add_model(repo, "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    return repo


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _grpc_infer(client, value: float = 1.0, **kw):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], dtype=np.float32))
    return client.infer("m", [x], **kw).as_numpy("OUTPUT0").tolist()


def _http_infer(client, value: float = 1.0, **kw):  # type: ignore[no-untyped-def]
    import tritonclient.http as httpclient

    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], dtype=np.float32))
    return client.infer("m", [x], **kw).as_numpy("OUTPUT0").tolist()


# -- TLS -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(repo: Path, certs: Certs):  # type: ignore[no-untyped-def]
    from conftest import running

    args = ["--grpc-use-ssl", "true", "--grpc-server-cert", str(certs.server_cert),
            "--grpc-server-key", str(certs.server_key),
            "--http-use-ssl", "true", "--http-server-cert", str(certs.server_cert),
            "--http-server-key", str(certs.server_key)]
    with running(repo, extra_args=args) as server:
        yield server


def test_grpc_tls_with_tritonclients_ssl_options(tls_server, certs: Certs) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(tls_server.url, ssl=True, root_certificates=str(certs.ca))
    assert client.is_server_ready() and _grpc_infer(client, 3.0) == [3.0]
    client.close()
    plain = grpcclient.InferenceServerClient(tls_server.url)  # a plain-text client gets nothing
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=5)
    plain.close()
    wrong = grpcclient.InferenceServerClient(tls_server.url, ssl=True, root_certificates=str(certs.other_ca))
    with pytest.raises(InferenceServerException):  # the server's certificate is not signed by that CA
        wrong.is_server_live(client_timeout=5)
    wrong.close()


def test_http_tls_with_tritonclients_ssl_options(tls_server, certs: Certs) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(tls_server.http_url, ssl=True, ssl_options={"ca_certs": str(certs.ca)})
    assert client.is_server_ready() and _http_infer(client, 4.0) == [4.0]
    client.close()
    with pytest.raises(Exception):  # plain HTTP to the TLS port
        urllib.request.urlopen(f"http://{tls_server.http_url}/v2/health/ready", timeout=5).read()


@pytest.fixture(scope="module")
def mtls_server(repo: Path, certs: Certs):  # type: ignore[no-untyped-def]
    from conftest import running

    args = ["--grpc-use-ssl-mutual", "true", "--grpc-server-cert", str(certs.server_cert),
            "--grpc-server-key", str(certs.server_key), "--grpc-root-cert", str(certs.ca),
            "--http-use-ssl-mutual", "true", "--http-server-cert", str(certs.server_cert),
            "--http-server-key", str(certs.server_key), "--http-root-cert", str(certs.ca)]
    with running(repo, extra_args=args) as server:
        yield server


def test_grpc_mutual_tls_needs_a_client_certificate(mtls_server, certs: Certs) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(
        mtls_server.url, ssl=True, root_certificates=str(certs.ca), private_key=str(certs.client_key),
        certificate_chain=str(certs.client_cert))
    assert _grpc_infer(client, 5.0) == [5.0]
    client.close()
    anonymous = grpcclient.InferenceServerClient(mtls_server.url, ssl=True, root_certificates=str(certs.ca))
    with pytest.raises(InferenceServerException):
        anonymous.is_server_live(client_timeout=5)
    anonymous.close()


def test_http_mutual_tls_needs_a_client_certificate(mtls_server, certs: Certs) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(mtls_server.http_url, ssl=True, ssl_options={
        "ca_certs": str(certs.ca), "certfile": str(certs.client_cert), "keyfile": str(certs.client_key)})
    assert _http_infer(client, 6.0) == [6.0]
    client.close()
    anonymous = httpclient.InferenceServerClient(mtls_server.http_url, ssl=True,
                                                 ssl_options={"ca_certs": str(certs.ca)})
    with pytest.raises(Exception):
        anonymous.is_server_live()
    anonymous.close()


def _serve_fails(repo: Path, *args: str) -> str:
    """Start ``inferd serve`` with ``args``; it must exit 2 at once; its stderr."""
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                           "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stderr


def test_tls_flags_that_do_not_fit_are_refused_at_start(repo: Path, certs: Certs) -> None:
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in _serve_fails(
        repo, "--grpc-use-ssl", "true")
    assert "--http-use-ssl-mutual needs --http-root-cert" in _serve_fails(
        repo, "--http-use-ssl-mutual", "true", "--http-server-cert", str(certs.server_cert),
        "--http-server-key", str(certs.server_key))


# -- restricted endpoints ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restricted(repo: Path):  # type: ignore[no-untyped-def]
    from conftest import running

    args = ["--grpc-restricted-protocol", "model-repository,shared-memory,statistics:admin-key=s3cret",
            "--grpc-restricted-protocol", "inference:infer-key=go",
            "--http-restricted-api", "model-repository,shared-memory,trace,logging:admin-key=s3cret",
            "--http-restricted-api", "inference:infer-key=go",
            "--grpc-max-message-bytes", "65536", "--http-max-input-size", "65536"]
    with running(repo, extra_args=args) as server:
        yield server


ADMIN_GRPC = {"triton-grpc-protocol-admin-key": "s3cret"}
INFER_GRPC = {"triton-grpc-protocol-infer-key": "go"}


def test_grpc_restricted_groups_need_their_header(restricted) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(restricted.url)
    for call in (lambda h: client.get_model_repository_index(headers=h),
                 lambda h: client.get_system_shared_memory_status(headers=h),
                 lambda h: client.get_inference_statistics("m", headers=h)):
        with pytest.raises(InferenceServerException) as info:
            call(None)
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'" in info.value.message()
        with pytest.raises(InferenceServerException, match="restricted"):
            call({"triton-grpc-protocol-admin-key": "wrong"})
        call(ADMIN_GRPC)  # the right header opens it
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(client)
    assert info.value.status() == "StatusCode.PERMISSION_DENIED" and "infer-key" in info.value.message()
    with pytest.raises(InferenceServerException, match="restricted"):
        _grpc_infer(client, headers=ADMIN_GRPC)  # one group's key does not open another
    assert _grpc_infer(client, 7.0, headers=INFER_GRPC) == [7.0]
    # Groups not named stay open.
    assert client.is_server_ready() and client.get_model_metadata("m").name == "m"
    client.close()
    assert "refused ModelInfer (inference, restricted)" in restricted.log()


def test_grpc_stream_restricted_too(restricted) -> None:  # type: ignore[no-untyped-def]
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(restricted.url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    try:
        client.async_stream_infer("m", [x])
    except Exception:  # the stream may be refused (and reported to the callback) before the request is queued
        pass
    result, error = results.get(timeout=30)
    assert result is None and "restricted" in str(error)
    client.stop_stream()
    client.close()


def test_http_restricted_apis_need_their_header(restricted) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(restricted.http_url)
    for call in (lambda h: client.get_model_repository_index(headers=h),
                 lambda h: client.get_system_shared_memory_status(headers=h),
                 lambda h: client.get_trace_settings(headers=h),
                 lambda h: client.get_log_settings(headers=h)):
        with pytest.raises(InferenceServerException) as info:
            call(None)
        assert info.value.status() == "403" and "This API is restricted, expecting header 'admin-key'" in \
            info.value.message()
        call({"admin-key": "s3cret"})
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        _http_infer(client)
    assert _http_infer(client, 8.0, headers={"infer-key": "go"}) == [8.0]
    assert client.is_server_ready() and client.get_inference_statistics("m")  # not restricted over HTTP here
    client.close()
    assert "refused POST /v2/repository/index (model-repository, restricted)" in restricted.log()


def test_restriction_flags_that_do_not_fit_are_refused_at_start(repo: Path) -> None:
    assert "unknown group 'bogus'" in _serve_fails(repo, "--grpc-restricted-protocol", "bogus:k=v")
    assert "restricted twice" in _serve_fails(
        repo, "--http-restricted-api", "trace:a=b", "--http-restricted-api", "trace,logging:c=d")
    assert "expected <groups>:<key>=<value>" in _serve_fails(repo, "--http-restricted-api", "trace")


# -- size limits -------------------------------------------------------------------------------------------------------


def test_grpc_message_size_limit(restricted) -> None:  # type: ignore[no-untyped-def]
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.append(32768)
    msg.raw_input_contents.append(np.zeros(32768, np.float32).tobytes())  # 128 KiB > 64 KiB
    with grpc.insecure_channel(restricted.url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pbg.GRPCInferenceServiceStub(channel).ModelInfer(msg, metadata=tuple(INFER_GRPC.items()), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in info.value.details()


def _post(server, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_http_body_size_limit_also_after_decompression(restricted) -> None:  # type: ignore[no-untyped-def]
    head = {"Content-Type": "application/json", "infer-key": "go"}
    big = json.dumps({"inputs": [{"name": "INPUT0", "shape": [20000], "datatype": "FP32",
                                  "data": [0.5] * 20000}]}).encode()
    status, doc = _post(restricted, "/v2/models/m/infer", big, head)
    assert status == 413 and "--http-max-input-size" in doc["error"] and "65536" in doc["error"]
    bomb = gzip.compress(big + b" " * (4 << 20))  # a few KiB on the wire, 4 MiB unpacked
    assert len(bomb) < 65536
    status, doc = _post(restricted, "/v2/models/m/infer", bomb, {**head, "Content-Encoding": "gzip"})
    assert status == 400 and doc["error"].startswith("Decompressed data size exceeds the maximum allowed value")
    small = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    status, doc = _post(restricted, "/v2/models/m/infer", gzip.compress(small), {**head, "Content-Encoding": "gzip"})
    assert status == 200 and doc["outputs"][0]["data"] == [1, 2]


# -- nothing outside /dev/shm or the model's folder --------------------------------------------------------------------


def test_shared_memory_keys_cannot_reach_outside_dev_shm(tmp_path: Path) -> None:
    from inferd.dataplane.shared_memory import SharedMemoryManager
    from inferd.errors import InvalidArgument

    manager = SharedMemoryManager()
    link = Path("/dev/shm") / f"inferd_test_link_{os.getpid()}"
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 4096)
    link.symlink_to(target)
    try:
        for key in ("/etc/passwd", "../etc/passwd", "/../etc/passwd", "a/b", "..", "/", "", "x\x00y", f"/{link.name}"):
            with pytest.raises(InvalidArgument):
                manager.register("r", key, 0, 16)
        assert len(manager) == 0
    finally:
        link.unlink()


def test_a_load_request_cannot_read_outside_the_model_folder(start_server, tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from inferd.examples import onnx_models as om

    add_model(tmp_path, "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    server = start_server(tmp_path, ["--model-control-mode", "explicit"])
    client = grpcclient.InferenceServerClient(server.url)
    tensor = {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}
    escapes = [
        {"default_model_filename": "../../../../etc/passwd"},
        {"default_model_filename": "/etc/passwd"},
        {"output": [{**tensor, "name": "OUTPUT0", "label_filename": "../../../etc/passwd"}]},
    ]
    for extra in escapes:
        body = {"name": "m", "platform": "onnxruntime_onnx", "input": [tensor],
                "output": [{**tensor, "name": "OUTPUT0"}], **extra}
        with pytest.raises(InferenceServerException) as info:
            client.load_model("m", config=json.dumps(body))
        assert "must name a file inside the model's folder" in info.value.message(), info.value.message()
    for name in ("../m", "m/../../etc", "/etc"):
        with pytest.raises(InferenceServerException, match="no such model"):
            client.load_model(name)
    client.load_model("m")  # the model's own config still loads
    assert _grpc_infer(client, 9.0) == [9.0]
    client.close()
