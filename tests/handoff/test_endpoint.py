"""The core's hand-off endpoint over a recording channel: one final message per request, whether
it is answered, refused, cancelled (even by a CANCEL in the same channel read, before a stream's
task has started) or its worker is lost."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inferd.dataplane import DataPlane
from inferd.examples import onnx_models as om
from inferd.handoff.core import endpoint as ep
from inferd.handoff.messages import STREAM, Cancel, Error, Free, Infer, InputTensor, Response
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.handoff.core.endpoint import CANCELLED, DataPlaneEndpoint
from inferd.repository import ModelManager
from repo_builder import add_model, config

IO = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
WAIT = 10.0


class Recorder:
    """The endpoint's channel: keeps what the core sends."""

    more = False

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any, at_once: bool = False) -> None:
        self.sent.append(message)


class FakeWorker:
    index = 0

    def __init__(self) -> None:
        self.channel = Recorder()
        self.inputs = Arena.create(1 << 20)
        self.outputs = ArenaWriter(Arena.create(1 << 20))


@pytest.fixture
async def core(tmp_path):
    add_model(tmp_path, "simple", om.add_sub(np.int32, 16, batch=True), config("simple", IO, OUT, 8))
    # A queue delay no test waits out: its requests stay queued until cancelled.
    add_model(tmp_path, "delayed", om.add_sub(np.int32, 16, batch=True),
              config("delayed", IO, OUT, 8, extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }"))
    dp = DataPlane(ModelManager([tmp_path]))
    await dp.load_models()
    link = FakeWorker()
    a = np.arange(16, dtype=np.int32)
    link.inputs.write(0, a.tobytes())
    yield DataPlaneEndpoint(link, dp, lambda *args: None), link
    await dp.close()


def infer(rid: int, model: str, flags: int = 0) -> Infer:
    tensors = [InputTensor(name, "INT32", [1, 16], 0, 64, None) for name in ("INPUT0", "INPUT1")]
    return Infer(rid=rid, model=model, version="", id=f"r{rid}", parameters=None, inputs=tensors, outputs=None,
                 flags=flags, deadline=None, trace=None, received=0, openai_prompt_tokens=None, frontend=None)


async def until(predicate) -> None:  # type: ignore[no-untyped-def]
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0)
    await asyncio.wait_for(wait(), WAIT)


async def test_an_infer_is_answered_with_its_outputs_in_the_output_arena(core):
    endpoint, link = core
    endpoint.on_message(infer(1, "simple"))
    await until(lambda: link.channel.sent)
    (reply,) = link.channel.sent
    assert type(reply) is Response
    assert (reply.rid, reply.final, reply.model, reply.id) == (1, True, "simple", "r1")
    out = {o.name: o for o in reply.outputs}["OUTPUT0"]
    got = np.frombuffer(link.outputs.arena.read(out.offset, out.nbytes), np.int32).reshape(out.shape)
    np.testing.assert_array_equal(got, 2 * np.arange(16, dtype=np.int32).reshape(1, 16))
    assert out.datatype == "INT32" and not endpoint.runs
    assert endpoint.dp.admission.requests == 0 and endpoint.dp.admission.bytes == 0  # released as answered
    endpoint.on_message(Free([reply.block]))


async def test_a_refused_request_gets_one_final_error_naming_the_model(core):
    endpoint, link = core
    endpoint.on_message(infer(2, "missing"))
    (reply,) = link.channel.sent
    assert type(reply) is Error and (reply.rid, reply.final, reply.kind) == (2, True, "NotFound")
    assert "missing" in reply.message


async def test_a_cancelled_queued_request_never_runs_and_gets_one_final_error(core):
    endpoint, link = core
    endpoint.on_message(infer(3, "delayed"))
    await asyncio.sleep(0)
    assert 3 in endpoint.runs and not link.channel.sent
    assert endpoint.dp.admission.requests == 1
    endpoint.on_message(Cancel(3))
    assert link.channel.sent == [Error(3, True, "Cancelled", CANCELLED)]
    assert endpoint.dp.admission.requests == 0 and endpoint.dp.admission.bytes == 0
    await asyncio.sleep(0)
    (stats,) = await endpoint.dp.model_statistics("delayed")
    assert stats.inference_count == 0 and not endpoint.runs
    assert len(link.channel.sent) == 1


async def test_a_lost_worker_drops_its_queued_requests_without_answering(core):
    endpoint, link = core
    endpoint.on_message(infer(4, "delayed"))
    await asyncio.sleep(0)
    endpoint.lost()
    await asyncio.sleep(0)
    (stats,) = await endpoint.dp.model_statistics("delayed")
    assert stats.inference_count == 0 and not endpoint.runs and not link.channel.sent
    assert endpoint.dp.inflight() == 0 and endpoint.dp.admission.requests == 0


# -- stream requests: a task each ------------------------------------------------------


class _StreamPlane:
    def __init__(self) -> None:
        self.started = 0

    async def infer_stream(self, request: Any):  # type: ignore[no-untyped-def]
        self.started += 1
        await asyncio.sleep(60)
        yield None


def _stream_message(rid: int) -> Infer:
    return infer(rid, "streaming", STREAM)


@pytest.fixture
async def stream_core(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ep, "request_from", lambda msg, inputs: SimpleNamespace(cancelled=False, frontend=None))
    channel = Recorder()
    link = SimpleNamespace(channel=channel, inputs=None, outputs=None, index=0)
    return DataPlaneEndpoint(link, _StreamPlane(), lambda *a: None), channel  # type: ignore[arg-type]


async def test_a_cancel_read_with_its_stream_infer_still_gets_the_final_answer(stream_core) -> None:  # type: ignore[no-untyped-def]
    core, channel = stream_core
    core.on_message(_stream_message(7))
    core.on_message(Cancel(7))  # same read: the task has not started
    for _ in range(5):
        await asyncio.sleep(0)
    assert channel.sent == [Error(7, True, "Cancelled", CANCELLED)]
    assert core.tasks == {} and core.dp.started == 0


async def test_a_stream_cancelled_after_its_start_is_answered_once(stream_core) -> None:  # type: ignore[no-untyped-def]
    core, channel = stream_core
    core.on_message(_stream_message(8))
    await asyncio.sleep(0)  # the request reached the data plane
    core.on_message(Cancel(8))
    for _ in range(5):
        await asyncio.sleep(0)
    assert channel.sent == [Error(8, True, "Cancelled", CANCELLED)]
    assert core.tasks == {} and core.dp.started == 1
