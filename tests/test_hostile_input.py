"""Issue 16, item 4: hostile input, property-based (the requests: tests/hostile.py).

Every request is answered with an error a client can act on, or served: never a crash, never
UNKNOWN or INTERNAL, always a message; the server's memory stays flat.

- In process, 10,000 generated ModelInfer requests and 10,000 HTTP bodies go through the same code a
  server runs (the gRPC/HTTP decoders, then DataPlane.infer over loaded models, then the encoders):
  only :class:`InferdError` of a client-facing kind may come out. This is the bulk, kept fast.
- Over the wire, a sample of each (``INFERD_FUZZ_WIRE_EXAMPLES``, 150 by default) against a real
  server, checking status codes and messages and the server's RSS before and after. The full
  10,000-over-the-wire run: ``INFERD_FUZZ_WIRE_EXAMPLES=10000 pytest tests/test_hostile_input.py -k wire``
  (or ``python -m bench --scenario hostile_input``, which records it in bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import hostile
from inferd.errors import InferdError

IN_PROCESS_EXAMPLES = int(os.environ.get("INFERD_FUZZ_EXAMPLES", "10000"))
WIRE_EXAMPLES = int(os.environ.get("INFERD_FUZZ_WIRE_EXAMPLES", "150"))
CLIENT_KINDS = {"INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED",
                "DEADLINE_EXCEEDED", "ALREADY_EXISTS"}
FUZZ = settings(max_examples=IN_PROCESS_EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class _Region:
    """A system shared memory object of hostile.REGION_BYTES bytes for the regions the requests name."""

    def __init__(self) -> None:
        import tritonclient.utils.shared_memory as shm

        self.shm = shm
        self.key = f"/inferd_fuzz_{os.getpid()}"
        self.handle = shm.create_shared_memory_region(hostile.REGION, self.key, hostile.REGION_BYTES)

    def close(self) -> None:
        self.shm.destroy_shared_memory_region(self.handle)


# -- in process: the decoders and the data plane -----------------------------------------------------------------


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from inferd.dataplane import DataPlane
    from inferd.repository import ModelManager

    repo = hostile.build_repository(tmp_path_factory.mktemp("hostile_repo"))
    loop = asyncio.new_event_loop()
    dp = DataPlane(ModelManager([repo]), allow_client_shm=True)
    loop.run_until_complete(dp.load_models())
    assert dp.ready_now(), dp.manager.index()
    region = _Region()
    loop.run_until_complete(dp.shm_register(hostile.REGION, region.key, 0, hostile.REGION_BYTES))
    yield loop, dp
    loop.run_until_complete(dp.close())
    loop.close()
    region.close()


def _client_error(exc: BaseException) -> None:
    """Raise unless ``exc`` is an error a client is meant to get, with a message."""
    if not isinstance(exc, InferdError) or exc.kind not in CLIENT_KINDS or not exc.message.strip():
        raise AssertionError(f"{type(exc).__name__} ({getattr(exc, 'kind', '?')}): {exc}") from exc


@pytest.mark.fixed_mode  # in process: no server, so no process mode to run it in twice
@FUZZ
@given(data=hostile.grpc_requests())
def test_grpc_requests_in_process(plane, data: bytes) -> None:  # type: ignore[no-untyped-def]
    from inferd._proto import grpc_service_pb2 as pb
    from inferd.frontends import grpc_codec as codec

    loop, dp = plane
    msg = pb.ModelInferRequest.FromString(data)
    try:
        request = codec.decode_infer_request(msg)
        response = loop.run_until_complete(dp.infer(request))
        codec.encode_infer_response(response, request.requested_outputs).SerializeToString()
    except Exception as exc:
        _client_error(exc)


@pytest.mark.fixed_mode  # in process: no server, so no process mode to run it in twice
@FUZZ
@given(case=hostile.http_bodies())
def test_http_bodies_in_process(plane, case: tuple[str, bytes, dict[str, str]]) -> None:  # type: ignore[no-untyped-def]
    from inferd.facade import DECOUPLED_HTTP
    from inferd.frontends import http_codec

    loop, dp = plane
    name, body, headers = case
    try:
        decoded = http_codec.decode_infer_request(name, "", body, headers.get("Inference-Header-Content-Length"))
        response = loop.run_until_complete(dp.infer(decoded.request, decoupled_error=DECOUPLED_HTTP))
        http_codec.encode_infer_response(response, decoded)
    except Exception as exc:
        _client_error(exc)
    assert dp.inflight() == 0  # every admitted request was released


# -- over the wire --------------------------------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import grpc
    import tritonclient.grpc as grpcclient

    from conftest import running

    repo = hostile.build_repository(tmp_path_factory.mktemp("hostile_wire"))
    region = _Region()
    try:
        with running(repo, extra_args=["--allow-client-shm"]) as server:
            client = grpcclient.InferenceServerClient(server.url)
            client.register_system_shared_memory(hostile.REGION, region.key, hostile.REGION_BYTES)
            client.close()
            channel = grpc.insecure_channel(server.url)
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # raw bytes both ways
            yield server, infer
            channel.close()
    finally:
        region.close()


WIRE = settings(FUZZ, max_examples=WIRE_EXAMPLES)


def grpc_answer(infer, data: bytes) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """(status code name, details) the server gave ``data``; ("OK", "") when it served it."""
    import grpc

    try:
        infer(data, timeout=60)
        return "OK", ""
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""


def http_answer(server, name: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    """(status, body) the server gave; a server that answers before reading a large body (a 404 for a
    path that names no model) may close the connection while it is still being sent: its answer is
    read all the same."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        try:
            conn.request("POST", f"/v2/models/{urllib.parse.quote(name, safe='')}/infer", body, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def check_grpc_answer(code: str, details: str) -> None:
    assert code not in ("UNKNOWN", "INTERNAL") and (code == "OK" or details.strip()), (code, details)


def check_http_answer(status: int, body: bytes) -> None:
    import json

    assert status < 500 or status == 503, (status, body[:300])
    if status != 200:
        assert json.loads(body).get("error", "").strip(), (status, body[:300])


def test_wire_grpc_and_http_samples_never_crash_and_memory_stays_flat(wire) -> None:  # type: ignore[no-untyped-def]
    server, infer = wire
    pid = server.proc.pid

    @WIRE
    @given(data=hostile.grpc_requests())
    def grpc_case(data: bytes) -> None:
        check_grpc_answer(*grpc_answer(infer, data))

    @WIRE
    @given(case=hostile.http_bodies())
    def http_case(case: tuple[str, bytes, dict[str, str]]) -> None:
        check_http_answer(*http_answer(server, *case))

    grpc_case()  # warms the server's allocators up too
    http_case()
    before = _rss_mib(pid)
    grpc_case()
    http_case()
    after = _rss_mib(pid)
    assert after - before < 48, f"RSS grew from {before:.0f} to {after:.0f} MiB over a second round"
    assert server.proc.poll() is None and "Traceback" not in server.log(), server.log()[-3000:]


def test_wire_undecodable_grpc_bytes_are_invalid_argument(start_server, tmp_path: Path) -> None:
    """Bytes that are no ModelInferRequest at all. Needs issue 14's request deserializer (branch compat,
    "gRPC: undecodable request bytes answer INVALID_ARGUMENT on every RPC"): without it grpc answers UNKNOWN."""
    import grpc
    from hypothesis import strategies as st

    server = start_server(hostile.build_repository(tmp_path))  # its own server: today's logs a traceback
    channel = grpc.insecure_channel(server.url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    @settings(WIRE, max_examples=max(20, WIRE_EXAMPLES // 5))
    @given(data=st.one_of(st.binary(min_size=1, max_size=200),
                          hostile.grpc_requests().map(lambda b: b[: max(1, len(b) // 2)] + b"\xff\xff\xff")))
    def case(data: bytes) -> None:
        from inferd._proto import grpc_service_pb2 as pb

        try:
            pb.ModelInferRequest.FromString(data)
        except Exception:
            code, details = grpc_answer(infer, data)
            assert code == "INVALID_ARGUMENT" and details.strip(), (code, details)

    try:
        case()
    finally:
        channel.close()
