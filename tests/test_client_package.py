"""The client package in clients/: its stubs match proto/, its tensors round-trip, and
every runnable example in clients/examples/ works against a real server."""

from __future__ import annotations

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
