"""The time a frontend received a request crosses the hand-off: stamped by the worker's gRPC edge and by
its proxy (HTTP, streams), carried in Infer, read by the core into InferenceRequest.received_ns; and a
worker refuses past its share of the server-wide request cap before it sends anything."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest

from inferd._proto import grpc_service_pb2 as pb
from inferd.errors import Unavailable
from inferd.handoff.core.endpoint import request_from
from inferd.handoff.worker.core_link import CoreLink
from inferd.handoff.worker.modelinfer import infer_message
from inferd.handoff.worker.proxy import RemoteDataPlane
from inferd.ipc.arena import Arena
from inferd.types import InferenceRequest


def _grpc_request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="simple")
    t = msg.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.extend([1, 4])
    msg.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    return msg


class _Channel:
    """What a CoreLink uses of its channel, recording what it would send."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.hooks: list[Callable[[], None]] = []

    def before_flush(self, hook: Callable[[], None]) -> None:
        self.hooks.append(hook)

    def send(self, msg: Any, at_once: bool = False) -> None:
        self.sent.append(msg)

    def wake(self) -> None:
        for hook in self.hooks:
            hook()


def _link(arena_bytes: int = 1 << 16) -> tuple[CoreLink, Arena]:
    """A worker's CoreLink (on the running loop) over a recording channel, and the core's view of its
    input arena."""
    inputs, outputs = Arena.create(arena_bytes), Arena.create(arena_bytes)
    config = {"inputs": [os.dup(inputs.fd), inputs.size], "outputs": [os.dup(outputs.fd), outputs.size]}
    return CoreLink(_Channel(), config), inputs  # type: ignore[arg-type]


async def test_the_grpc_edge_carries_the_received_time_to_the_core() -> None:
    link, core_inputs = _link()
    block, message = infer_message(link, _grpc_request(), received_ns=123_456_789)
    assert message.received == 123_456_789
    request = request_from(message, core_inputs)
    assert request.received_ns == 123_456_789
    np.testing.assert_array_equal(request.inputs["INPUT0"], np.ones((1, 4), np.float32))


async def test_the_proxy_sends_the_frontends_stamp_or_stamps_one_itself() -> None:
    link, core_inputs = _link()
    proxy = RemoteDataPlane(link)
    x = np.ones((1, 4), np.float32)
    _, message = proxy._send(InferenceRequest("simple", {"INPUT0": x}, received_ns=42), 0, None)
    assert message.received == 42
    before = time.monotonic_ns()
    _, message = proxy._send(InferenceRequest("simple", {"INPUT0": x}), 0, None)
    assert message.received >= before
    assert request_from(message, core_inputs).received_ns == message.received


def test_a_worker_refuses_past_its_share_of_the_request_cap() -> None:
    refusals: list[None] = []
    link = SimpleNamespace(max_pending=2, max_queued=4, in_flight=[1], count_refused=lambda: refusals.append(None))
    CoreLink.refuse_if_full(link, "simple")  # type: ignore[arg-type]
    assert refusals == []
    link.in_flight.append(2)
    with pytest.raises(Unavailable) as info:
        CoreLink.refuse_if_full(link, "simple")  # type: ignore[arg-type]
    assert len(refusals) == 1  # told to the core, for the server-wide overload counter
    m = info.value.message
    assert "model 'simple'" in m and "overloaded" in m and "2 requests" in m and "--max-queued-requests 4" in m
    CoreLink.refuse_if_full(SimpleNamespace(max_pending=0, in_flight=[1, 2, 3]), "simple")  # type: ignore[arg-type]


async def test_a_request_the_input_arena_cannot_hold_is_refused_and_counted() -> None:
    from inferd.handoff.messages import Refused
    from inferd.ipc.arena import ArenaFull

    link, _ = _link()
    proxy = RemoteDataPlane(link)
    big = np.ones((1, 1 << 15), np.float32)  # 128 KiB: more than the 64 KiB arena
    with pytest.raises(ArenaFull):
        proxy._send(InferenceRequest("simple", {"INPUT0": big}), 0, None)
    with pytest.raises(ArenaFull):
        infer_message(link, _grpc_request_of(big))
    assert link.channel.sent == [Refused(1), Refused(1)]  # told to the core as the next write goes


def _grpc_request_of(array: np.ndarray) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="simple")
    t = msg.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.extend(array.shape)
    msg.raw_input_contents.append(array.tobytes())
    return msg
