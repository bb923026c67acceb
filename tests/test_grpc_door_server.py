"""--grpc-max-held-calls end to end, in the test's process mode (issue 42): with the server holding
as many calls as its bound (a gated model keeps them), each further inference call is refused at once
with UNAVAILABLE and the door's reason (never CANCELLED), counted as an overload refusal, and never
reaches the model; the calls held are all answered once the model is released. One client, so one
connection and, with frontend workers, one worker: its handlers hold every call (the sum over workers
is tests/test_grpc_door.py's)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from gated_model import add_gated_model, release, started_count, wait_pending_async, wait_started_async

BOUND = 8
EXTRA = 4


@pytest.fixture
def gated(tmp_path) -> tuple[Path, Path]:
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    add_gated_model(repo, "gated", gate)
    return repo, gate


def _input(value: float) -> list[aioclient.InferInput]:
    x = aioclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return [x]


async def _drive(server, gate: Path) -> tuple[list[InferenceServerException], list[float]]:  # type: ignore[no-untyped-def]
    client = aioclient.InferenceServerClient(server.url)
    try:
        held = [asyncio.ensure_future(client.infer("gated", _input(i), client_timeout=120)) for i in range(BOUND)]
        await wait_started_async(gate)
        await wait_pending_async(server.metrics_url, "gated", BOUND - 1)  # the bound's worth held
        refused = []
        for i in range(EXTRA):
            with pytest.raises(InferenceServerException) as info:
                await client.infer("gated", _input(100 + i), client_timeout=10)  # refused at once
            refused.append(info.value)
        release(gate)
        answers = await asyncio.gather(*held)
        return refused, [float(a.as_numpy("OUTPUT0")[0]) for a in answers]
    finally:
        release(gate)
        await client.close()


def test_calls_past_the_bound_are_refused_unavailable_with_the_reason_and_the_held_ones_answered(start_server,
                                                                                               gated) -> None:  # type: ignore[no-untyped-def]
    repo, gate = gated
    server = start_server(repo, ["--grpc-max-held-calls", str(BOUND)])
    refused, answered = asyncio.run(_drive(server, gate))
    for error in refused:
        assert error.status() == "StatusCode.UNAVAILABLE", error.message()
        # grpc.aio's door names the model and counts the call it refuses; the gRPC front's (Envoy's) says what
        # it holds
        assert "request refused: the server is overloaded: it already holds" in error.message(), error.message()
        assert error.message().endswith(f"past --grpc-max-held-calls {BOUND}; retry later")
    assert answered == [float(i) for i in range(BOUND)]
    assert started_count(gate) == BOUND  # no refused call reached the model
    assert server.metric("inferd_server_overload_rejected_total") == EXTRA
