"""The time a frontend received a request crosses the hand-off: stamped by the worker's gRPC edge and by
its proxy (HTTP, streams), carried in INFER, read by the core into InferenceRequest.received_ns; and a
worker refuses past its share of the server-wide request cap before it sends anything."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from inferd._proto import grpc_service_pb2 as pb
from inferd.errors import Unavailable
from inferd.handoff import wire
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.handoff.core.endpoint import request_from
from inferd.handoff.worker.core_link import CoreLink
from inferd.handoff.worker.modelinfer import infer_message
from inferd.handoff.worker.proxy import RemoteDataPlane
from inferd.types import InferenceRequest


def _grpc_request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="simple")
    t = msg.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.extend([1, 4])
    msg.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    return msg


def test_the_grpc_edge_carries_the_received_time_to_the_core() -> None:
    arena = Arena.create(1 << 16)
    block, message = infer_message(7, _grpc_request(), ArenaWriter(arena), received_ns=123_456_789)
    assert message[wire.I_RECEIVED] == 123_456_789
    request = request_from(message, arena)
    assert request.received_ns == 123_456_789


class _Link:
    """What RemoteDataPlane._send reads of its CoreLink."""

    tracing = False

    def __init__(self) -> None:
        self.inputs = ArenaWriter(Arena.create(1 << 16))
        self.in_flight = SimpleNamespace(next_rid=lambda: 1)

    def refuse_if_draining(self) -> None:
        pass

    def refuse_if_full(self, model: str) -> None:
        pass

    refused = 0

    def count_refused(self) -> None:
        self.refused += 1


def test_the_proxy_sends_the_frontends_stamp_or_stamps_one_itself() -> None:
    proxy = RemoteDataPlane(_Link())  # type: ignore[arg-type]
    x = np.ones((1, 4), np.float32)
    _, _, message = proxy._send(InferenceRequest("simple", {"INPUT0": x}, received_ns=42), 0, None)
    assert message[wire.I_RECEIVED] == 42
    before = time.monotonic_ns()
    _, _, message = proxy._send(InferenceRequest("simple", {"INPUT0": x}), 0, None)
    assert message[wire.I_RECEIVED] >= before
    assert request_from(message, proxy.link.inputs.arena).received_ns == message[wire.I_RECEIVED]


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


def test_a_request_the_input_arena_cannot_hold_is_refused_and_counted() -> None:
    from inferd.ipc.arena import ArenaFull

    link = _Link()
    proxy = RemoteDataPlane(link)  # type: ignore[arg-type]
    big = np.ones((1, 1 << 15), np.float32)  # 128 KiB: more than the 64 KiB arena
    with pytest.raises(ArenaFull):
        proxy._send(InferenceRequest("simple", {"INPUT0": big}), 0, None)
    assert link.refused == 1
