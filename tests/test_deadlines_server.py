"""A request that cannot be answered in time is refused at admission, not run for nobody (issue 42),
end to end over gRPC in the test's process mode.

The queue ahead is made by the test, not by timing: a gated model whose executions each sleep 0.4 s
(so its estimate is at least that) holds one execution while twelve requests queue behind it. A
request then sent with a 3 s gRPC deadline, or a 3 s ``timeout`` parameter, has at least 4.8 s of
work ahead of it: it is answered UNAVAILABLE at once with the estimate, and the model never runs it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from gated_model import add_gated_model, release, reset, started_count, wait_pending_async, wait_started_async

SLEEP_S = 0.4
AHEAD = 12


@pytest.fixture
def gated(tmp_path) -> tuple[Path, Path]:
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    add_gated_model(repo, "gated", gate, sleep_s=SLEEP_S)
    return repo, gate


def _input(value: float) -> aioclient.InferInput:
    x = aioclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return x


async def _refusals(server, gate: Path) -> list[InferenceServerException]:  # type: ignore[no-untyped-def]
    client = aioclient.InferenceServerClient(server.url)
    try:
        release(gate)
        for i in range(2):  # the model's estimate: executions of at least SLEEP_S
            await client.infer("gated", [_input(i)], client_timeout=120)
        reset(gate)
        held = [asyncio.ensure_future(client.infer("gated", [_input(10 + i)], client_timeout=120))
                for i in range(AHEAD + 1)]
        await wait_started_async(gate)
        await wait_pending_async(server.metrics_url, "gated", AHEAD)
        errors = []
        for call in (client.infer("gated", [_input(-1)], client_timeout=3),  # its gRPC deadline
                     client.infer("gated", [_input(-2)], timeout=3_000_000)):  # its timeout parameter
            with pytest.raises(InferenceServerException) as info:
                await call
            errors.append(info.value)
        release(gate)
        await asyncio.gather(*held)
        return errors
    finally:
        release(gate)
        await client.close()


def test_a_request_the_queue_ahead_cannot_answer_in_time_is_refused_at_admission(start_server, gated):
    repo, gate = gated
    server = start_server(repo)
    deadline, timeout = asyncio.run(_refusals(server, gate))
    assert deadline.status() == "StatusCode.UNAVAILABLE", deadline.message()
    assert "model 'gated': request refused: its deadline cannot be met: estimated" in deadline.message()
    assert f"{AHEAD} rows queued ahead of it" in deadline.message()
    assert timeout.status() == "StatusCode.UNAVAILABLE", timeout.message()
    assert "model 'gated': request refused: it cannot start within its queue timeout" in timeout.message()
    assert started_count(gate) == AHEAD + 1  # since the reset: neither refused request ever ran
