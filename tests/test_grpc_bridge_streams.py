"""Bridged streams (inferd/frontends/grpc_bridge.py): ModelStreamInfer as Envoy hands it over, gRPC over
HTTP/1.1 with a chunked body each way, driven here over the bridge's unix socket as Envoy drives it,
with a stand-in for the port's guarded ModelStreamInfer. (tests/test_grpc_front.py runs real streams
through Envoy, and the whole suite's streams go this way behind the default front.)"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import grpc
import pytest

from inferd._proto import grpc_service_pb2 as pb
from inferd.frontends.grpc_bridge import MODEL_STREAM_INFER, BridgePort

FRAME = struct.Struct(">BI")


def frame(message: Any, compressed: int = 0) -> bytes:
    body = message.SerializeToString() if hasattr(message, "SerializeToString") else message
    return FRAME.pack(compressed, len(body)) + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def head(extra: str = "") -> bytes:
    return (f"POST {MODEL_STREAM_INFER} HTTP/1.1\r\nhost: inferd\r\ncontent-type: application/grpc\r\n{extra}"
            "transfer-encoding: chunked\r\n\r\n").encode()


def request(rid: str) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="m", id=rid)


class Answer:
    """The bridge's answer, read as Envoy reads it: the head, then each chunk, then the trailers."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.head = b""

    async def start(self) -> str:
        self.head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        return self.head.decode()

    async def message(self) -> pb.ModelStreamInferResponse | dict[str, str]:
        """The next message, or the trailers (a dict) once the body ends."""
        size = int((await asyncio.wait_for(self.reader.readuntil(b"\r\n"), 10)).strip(), 16)
        if size == 0:
            trailers = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)).decode()
            return dict(line.split(": ", 1) for line in trailers.strip().split("\r\n"))
        data = await self.reader.readexactly(size + 2)
        compressed, length = FRAME.unpack_from(data)
        assert compressed == 0 and length == size - FRAME.size
        return pb.ModelStreamInferResponse.FromString(data[FRAME.size:size])


@pytest.fixture
async def bridge(tmp_path: Path):  # type: ignore[no-untyped-def]
    seen: dict[str, Any] = {"entered": asyncio.Event(), "ended": asyncio.Event()}

    async def handler(requests: Any, context: Any) -> None:
        seen["context"] = context
        seen["entered"].set()
        try:
            async for message in requests:
                if message.id == "abort":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
                if message.id != "hang":
                    await context.write(pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=message.id)))
            if context.invocation_metadata() and any(m.key == "hang-after" for m in context.invocation_metadata()):
                await asyncio.sleep(3600)
        finally:
            seen["ended"].set()

    async def unary(request: Any, context: Any) -> Any:
        raise AssertionError("no unary call in these tests")

    port = BridgePort(str(tmp_path / "bridge.sock"), unary, 64, handler)
    await port.start()
    yield port, seen
    await port.close(0)


async def connect(port: BridgePort, extra: str = "") -> tuple[asyncio.StreamWriter, Answer]:
    reader, writer = await asyncio.open_unix_connection(port.path)
    writer.write(head(extra))
    return writer, Answer(reader)


async def test_a_stream_is_answered_as_its_messages_come_and_ends_with_its_status(bridge) -> None:  # type: ignore[no-untyped-def]
    port, _ = bridge
    writer, answer = await connect(port)
    first = frame(request("1"))
    writer.write(chunk(first[:3]))  # a frame split across chunks arrives whole
    writer.write(chunk(first[3:]))
    assert (await answer.start()).startswith("HTTP/1.1 200 OK\r\ncontent-type: application/grpc")
    assert (await answer.message()).infer_response.id == "1"  # answered before the next is sent
    writer.write(chunk(frame(request("2")) + frame(request("3"))))
    assert [(await answer.message()).infer_response.id for _ in range(2)] == ["2", "3"]
    writer.write(b"0\r\n\r\n")  # the client's half-close
    assert await answer.message() == {"grpc-status": "0"}
    writer.close()


async def test_an_abort_is_the_streams_status_in_its_trailers_or_its_only_answer(bridge) -> None:  # type: ignore[no-untyped-def]
    port, _ = bridge
    writer, answer = await connect(port)
    writer.write(chunk(frame(request("1")) + frame(request("abort"))))
    await answer.start()
    assert (await answer.message()).infer_response.id == "1"
    assert await answer.message() == {"grpc-status": str(grpc.StatusCode.UNAVAILABLE.value[0]),
                                      "grpc-message": "the server is stopping"}
    writer.close()
    writer, answer = await connect(port)  # aborted before any message: headers only, as grpc.aio answers
    writer.write(chunk(frame(request("abort"))))
    text = await answer.start()
    assert "content-length: 0" in text and "grpc-status: 14\r\n" in text and "the server is stopping" in text
    writer.close()


@pytest.mark.parametrize("sent, code, details", [
    (frame(request("1"), compressed=1), grpc.StatusCode.INTERNAL,
     "the gRPC front sent a compressed message on a stream without grpc-encoding"),
    (frame(b"x" * 100), grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (100 vs. 64)"),
])
async def test_a_frame_the_bridge_cannot_take_ends_the_stream_with_grpcs_status(bridge, sent, code, details) -> None:  # type: ignore[no-untyped-def]
    port, seen = bridge
    writer, answer = await connect(port)
    writer.write(chunk(frame(request("1")) + sent))
    await answer.start()
    assert (await answer.message()).infer_response.id == "1"
    assert await answer.message() == {"grpc-status": str(code.value[0]), "grpc-message": details}
    await asyncio.wait_for(seen["ended"].wait(), 10)  # the handler was stopped
    writer.close()


async def test_the_client_leaving_cancels_the_stream(bridge) -> None:  # type: ignore[no-untyped-def]
    port, seen = bridge
    writer, answer = await connect(port)
    writer.write(chunk(frame(request("hang"))))
    await asyncio.wait_for(seen["entered"].wait(), 10)
    writer.close()  # Envoy resets the upstream connection when the client goes
    await asyncio.wait_for(seen["ended"].wait(), 10)
    assert seen["context"].cancelled()
    assert port.busy == 0


async def test_a_streams_deadline_ends_it_deadline_exceeded(bridge) -> None:  # type: ignore[no-untyped-def]
    port, seen = bridge
    writer, answer = await connect(port, "grpc-timeout: 20m\r\nhang-after: 1\r\n")
    writer.write(chunk(frame(request("hang"))) + b"0\r\n\r\n")
    text = await answer.start()
    assert "grpc-status: 4\r\n" in text and "grpc-message: Deadline Exceeded" in text
    await asyncio.wait_for(seen["ended"].wait(), 10)
    writer.close()
