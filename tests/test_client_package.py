"""The client package in clients/: its stubs match proto/, its tensors round-trip, and
every runnable example in clients/examples/ works against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from inferd_client import AsyncClient, Client, InferError, Output
from inferd_client._messages import build_request, decode_response
from inferd_client._proto import grpc_service_pb2 as pb
from inferd_client._tensors import deserialize, serialize

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "clients" / "examples").glob("*.py") if not p.stem.startswith("_"))


def test_the_examples_cover_what_the_package_promises() -> None:
    assert set(EXAMPLES) == {"infer", "bytes", "ensemble", "sequence_stream", "decoupled_stream",
                             "shared_memory", "priority_timeout"}


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs_against_a_real_server(example: str, example_server) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "clients" / "examples" / f"{example}.py"),
                           "--url", example_server.url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_client_stubs_are_generated_from_proto() -> None:
    """The committed stubs are what `python -m inferd._proto.generate` makes of proto/ today."""
    pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is not installed")
    from inferd._proto import generate

    stale = generate.stale_files(generate.render(), (generate.CLIENT_PACKAGE_DIR,))
    assert not stale, f"stale: {stale}; run `python -m inferd._proto.generate`"


def test_the_client_needs_no_server_package_and_shares_a_process_with_tritonclient() -> None:
    code = ("import sys, tritonclient.grpc, inferd_client; "
            "assert not any(m == 'inferd' or m.startswith('inferd.') for m in sys.modules), 'imported inferd'; "
            "print(inferd_client.Client.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "Client", proc.stderr


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.array([[1.5, -2.0]], dtype=np.float16),
    np.array([True, False]),
    np.array([[b"a", b""], [b"\x00\xff", "h\u00e9".encode()]], dtype=object),
    np.zeros((0, 4), dtype=np.float32),
])
def test_tensors_round_trip(array: np.ndarray) -> None:
    from inferd_client import datatype_of

    back = deserialize(serialize(array), datatype_of(array), array.shape)
    assert back.shape == array.shape and back.tolist() == array.tolist()


def test_strings_travel_as_utf8_bytes() -> None:
    raw = serialize(np.array(["h\u00e9"], dtype=object))
    assert raw == b"\x03\x00\x00\x00h\xc3\xa9"


def test_request_parameters_and_shared_memory_outputs() -> None:
    msg = build_request("m", {"X": np.zeros((1, 2), np.float32)}, priority=2, timeout_us=500, sequence_id=7,
                        sequence_start=True, outputs=["Y", Output("Z", region="r", byte_size=8, offset=4)])
    params = {k: v.WhichOneof("parameter_choice") for k, v in msg.parameters.items()}
    assert params == {"priority": "int64_param", "timeout": "int64_param", "sequence_id": "int64_param",
                      "sequence_start": "bool_param", "sequence_end": "bool_param"}
    assert msg.inputs[0].datatype == "FP32" and list(msg.inputs[0].shape) == [1, 2]
    z = msg.outputs[1].parameters
    assert (z["shared_memory_region"].string_param, z["shared_memory_byte_size"].int64_param,
            z["shared_memory_offset"].int64_param) == ("r", 8, 4)
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="Y", datatype="INT32", shape=[2])
    response.outputs.add(name="Z", datatype="INT32", shape=[2])
    response.raw_output_contents.extend([np.array([1, 2], np.int32).tobytes(), b""])
    result = decode_response(response)
    assert result["Y"].tolist() == [1, 2] and list(result) == ["Y"] and result.shapes["Z"] == (2,)
    with pytest.raises(KeyError, match="written to shared memory"):
        result["Z"]


def test_errors_carry_the_servers_status_and_message(example_server) -> None:
    with Client(example_server.url) as client:
        assert client.is_live() and client.is_ready() and client.is_model_ready("simple")
        assert client.server_metadata().name
        assert client.model_config("simple").max_batch_size == 8
        with pytest.raises(InferError) as info:
            client.infer("no_such_model", {"X": np.zeros(1, np.float32)})
    assert info.value.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
    assert "no_such_model" in info.value.message


async def test_async_client_streams_a_decoupled_model(example_server) -> None:
    async with AsyncClient(example_server.url) as client:
        meta = await client.model_metadata("repeat_decoupled")
        assert [t.name for t in meta.inputs] == ["IN", "REPEAT"]
        async with client.stream(deadline_s=60) as stream:
            stream.send("repeat_decoupled", {"IN": np.array([5], np.int32), "REPEAT": np.array([2], np.int32)},
                        parameters={"triton_enable_empty_final_response": True})
            stream.close_send()
            items = [item async for item in stream]
    assert not any(isinstance(i, InferError) for i in items), items
    data = [i for i in items if "OUT" in i]  # type: ignore[operator]
    assert sorted(int(i["IDX"][0]) for i in data) == [0, 1]  # type: ignore[index]
    assert [i.final for i in items if "OUT" not in i] == [True]  # type: ignore[union-attr,operator]


# -- the whole client, over mutual TLS, by gRPC and HTTP, blocking and asyncio ----------------------------

SCALE_IO = ([("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])])
SCALE_CONFIG = {"platform": "onnxruntime_onnx", "max_batch_size": 2,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}


@pytest.fixture(scope="module")
def control_server(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Explicit model control and mutual TLS on both frontends: every client call is tried
    through the certificates, and loads/unloads touch only this server."""
    from certs import make_certs
    from conftest import running
    from repo_builder import add_model, config

    from inferd.examples import onnx_models as om

    repo = tmp_path_factory.mktemp("client_repo")
    add_model(repo, "scaler", om.scale(4, factor=2.0), config("scaler", *SCALE_IO, 2))
    add_model(repo, "idle", om.scale(4, factor=3.0), config("idle", *SCALE_IO, 2))
    certs = make_certs(tmp_path_factory.mktemp("client_certs"))
    tls = []
    for proto in ("grpc", "http"):
        tls += [f"--{proto}-use-ssl-mutual", "true", f"--{proto}-server-cert", str(certs.server_cert),
                f"--{proto}-server-key", str(certs.server_key), f"--{proto}-root-cert", str(certs.ca)]
    with running(repo, extra_args=["--model-control-mode", "explicit", "--load-model", "scaler",
                                         "--allow-client-shm", *tls]) as server:
        yield server, certs


def _client(kind: str, server, certs, **kw):  # type: ignore[no-untyped-def]
    from inferd_client import AsyncHttpClient, HttpClient

    tls = dict(root_certificates=str(certs.ca), private_key=str(certs.client_key),
               certificate_chain=str(certs.client_cert), **kw)
    host = server.url if kind in ("grpc", "grpc-aio") else server.http_url
    host = host.replace("127.0.0.1", "localhost")  # the name the server certificate carries
    return {"grpc": Client, "grpc-aio": AsyncClient, "http": HttpClient, "http-aio": AsyncHttpClient}[kind](
        host, **tls)


async def _maybe(value):  # type: ignore[no-untyped-def]
    import inspect

    return await value if inspect.isawaitable(value) else value


KINDS = ["grpc", "grpc-aio", "http", "http-aio"]


@pytest.mark.parametrize("kind", KINDS)
async def test_every_call_of_the_client(kind: str, control_server) -> None:  # type: ignore[no-untyped-def]
    server, certs = control_server
    c = _client(kind, server, certs, headers={"x-tenant": "t1"})
    call = _maybe
    try:
        assert await call(c.is_live()) and await call(c.is_ready())
        assert (await call(c.server_metadata())).name
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        result = await call(c.infer("scaler", {"INPUT0": x}, request_id="r1"))
        assert result["OUTPUT0"].tolist() == [[0.0, 2.0, 4.0, 6.0]] and result.id == "r1"
        meta = await call(c.model_metadata("scaler"))
        assert [t.name for t in meta.inputs] == ["INPUT0"] and meta.inputs[0].shape == (-1, 4)
        cfg = await call(c.model_config("scaler"))
        assert (cfg["max_batch_size"] if isinstance(cfg, dict) else cfg.max_batch_size) == 2
        (stats,) = await call(c.model_statistics("scaler"))
        assert stats.name == "scaler" and stats.inference["success"].count >= 1 and stats.inference_count >= 1
        index = {m.name: m for m in await call(c.repository_index())}
        assert index["scaler"].state == "READY" and index["idle"].state != "READY"
        assert [m.name for m in await call(c.repository_index(ready=True))] == ["scaler"]

        # a load with a config override (and files), then an unload
        name = f"made_{kind.replace('-', '_')}"
        await call(c.load_model(name, config=SCALE_CONFIG,
                                files={"1/model.onnx": om_scale(5.0)}))
        assert (await call(c.infer(name, {"INPUT0": x})))["OUTPUT0"].tolist() == [[0.0, 5.0, 10.0, 15.0]]
        override = dict(SCALE_CONFIG, instance_group=[{"count": 2, "kind": "KIND_CPU"}])
        await call(c.load_model(name, config=json.dumps(override), files={"1/model.onnx": om_scale(5.0)}))
        cfg = await call(c.model_config(name))
        groups = cfg["instance_group"] if isinstance(cfg, dict) else [{"count": g.count} for g in cfg.instance_group]
        assert groups[0]["count"] == 2
        await call(c.unload_model(name))
        assert not await call(c.is_model_ready(name))
        with pytest.raises(InferError) as info:
            await call(c.infer(name, {"INPUT0": x}))
        assert name in info.value.message and info.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)

        # trace and log settings: change, read back, restore
        before = await call(c.get_trace_settings("scaler"))
        assert "trace_rate" in before
        after = await call(c.update_trace_settings({"trace_rate": "7"}, model="scaler"))
        assert str(after["trace_rate"]) == "7" and str((await call(c.get_trace_settings("scaler")))["trace_rate"]) == "7"
        await call(c.update_trace_settings({"trace_rate": None}, model="scaler"))
        assert str((await call(c.get_trace_settings("scaler")))["trace_rate"]) == str(before["trace_rate"])
        logs = await call(c.update_log_settings({"log_verbose_level": 1}))
        assert logs["log_verbose_level"] == 1
        assert (await call(c.update_log_settings({"log_verbose_level": 0})))["log_verbose_level"] == 0

        # shared memory, system and CUDA status
        from inferd_client import ShmInput, SystemSharedMemoryRegion

        key = f"inferd_client_test_{kind}_{os.getpid()}"
        with SystemSharedMemoryRegion.create(key, 64) as region:
            size = region.write(x)
            await call(c.register_system_shared_memory("in", key, 64))
            status = await call(c.system_shared_memory_status())
            assert status["in"].byte_size == 64 and status["in"].key == key
            got = await call(c.infer("scaler", {"INPUT0": ShmInput("in", "FP32", (1, 4), size)}))
            assert got["OUTPUT0"].tolist() == [[0.0, 2.0, 4.0, 6.0]]
            await call(c.unregister_system_shared_memory("in"))
            assert await call(c.system_shared_memory_status()) == {}
        assert await call(c.cuda_shared_memory_status()) == {}
        with pytest.raises(InferError) as info:
            await call(c.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64))
        assert "gpu" in info.value.message or "CUDA" in info.value.message
    finally:
        await call(c.close())


def om_scale(factor: float) -> bytes:
    from inferd.examples import onnx_models as om

    return om.serialize(om.scale(4, factor=factor))


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_mutual_tls_refuses_a_client_without_a_certificate(kind: str, control_server) -> None:  # type: ignore[no-untyped-def]
    from inferd_client import HttpClient

    server, certs = control_server
    if kind == "grpc":
        client = Client(server.url.replace("127.0.0.1", "localhost"), root_certificates=str(certs.ca))
    else:
        client = HttpClient(server.http_url.replace("127.0.0.1", "localhost"), root_certificates=str(certs.ca))
    with client, pytest.raises((InferError, OSError)):
        client.infer("scaler", {"INPUT0": np.zeros((1, 4), np.float32)}, **({"deadline_s": 10} if kind == "grpc" else {}))
    with pytest.raises(ValueError, match="mutual TLS needs both"):
        Client("localhost:1", private_key=str(certs.client_key))


def test_http_errors_carry_both_statuses() -> None:
    from inferd_client._http_codec import Reply, error_of

    error = error_of(Reply(503, {}, b'{"error": "model \'m\' is draining"}'))
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.http_status == 503
    assert error.message == "model 'm' is draining"
