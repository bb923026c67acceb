"""Dynamic batching, queue policies, priorities and instance groups, end to end:
tritonclient (gRPC, asyncio) against a real ``inferd serve``.

Scenarios that need a busy instance send a "blocker": a big request to an MLP
large enough that one execution takes a few hundred milliseconds. A test
knows the blocker is executing (not just sent) when ModelStatistics counts
it as dispatched (``inference_stats.queue.count``, recorded at dispatch).
Each scenario has its own model, so statistics never mix.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, running
from inferd.examples import onnx_models as om

D = 256  # the MLP's input and output width
BIG_HIDDEN = 16384  # with BLOCKER_ROWS rows: a few hundred ms on a CPU core or two
BLOCKER_ROWS = 1536  # ~0.4 s: far longer than the 100 ms queue timeout, even on a quiet machine

THREAD = 'parameters { key: "inferd.execution" value { string_value: "thread" } }'
REJECT_100MS = "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 }"


def model_config(name: str, max_batch_size: int, dynamic_batching: str, count: int = 1) -> str:
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {D} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {D} ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
dynamic_batching {{ {dynamic_batching} }}
{THREAD}
"""


MODELS = {
    # name: (big model?, max_batch_size, dynamic_batching body, instance count)
    "batched": (False, 64, "max_queue_delay_microseconds: 100000", 1),
    "reject": (True, BLOCKER_ROWS, REJECT_100MS, 1),
    "full": (True, BLOCKER_ROWS, "default_queue_policy { max_queue_size: 1 }", 1),
    "prio": (True, BLOCKER_ROWS, "priority_levels: 2 default_priority_level: 2", 1),
    "deadline": (True, BLOCKER_ROWS, "", 1),
    "pair": (True, BLOCKER_ROWS, REJECT_100MS, 2),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("batching_repo")
    small = om.serialize(om.mlp(D, 1024, D))
    big = om.serialize(om.mlp(D, BIG_HIDDEN, D))
    for name, (is_big, mbs, db, count) in MODELS.items():
        model_dir = Path(repo) / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(model_config(name, mbs, db, count))
        (model_dir / "1" / "model.onnx").write_bytes(big if is_big else small)
    with running(repo, exit_zero=False, no_traceback=False) as srv:
        yield srv


@pytest.fixture
async def client(server: ServerProcess):
    c = aioclient.InferenceServerClient(server.url)
    yield c
    await c.close()


def inputs(rows: int, value: float = 0.0) -> list[aioclient.InferInput]:
    i = aioclient.InferInput("INPUT0", [rows, D], "FP32")
    i.set_data_from_numpy(np.full((rows, D), value, np.float32))
    return [i]


def infer(client, model: str, rows: int = 1, **kw) -> asyncio.Future:  # type: ignore[no-untyped-def]
    return asyncio.ensure_future(client.infer(model, inputs(rows), **kw))


async def stats(client, model: str):  # type: ignore[no-untyped-def]
    return (await client.get_inference_statistics(model)).model_stats[0]


async def dispatched(client, model: str, n: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until ``n`` requests of ``model`` left the queue for an instance."""
    deadline = time.monotonic() + 60
    while (await stats(client, model)).inference_stats.queue.count < n:
        assert time.monotonic() < deadline, f"{model}: {n} requests never dispatched"
        await asyncio.sleep(0.005)


async def failure(call: asyncio.Future) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        await call
    return info.value


async def test_concurrent_requests_are_batched(client):
    results = await asyncio.gather(*(infer(client, "batched") for _ in range(16)))
    assert len(results) == 16
    s = await stats(client, "batched")
    assert s.inference_count == 16
    assert 1 <= s.execution_count < s.inference_count
    assert sum(b.compute_infer.count for b in s.batch_stats) == s.execution_count
    assert max(b.batch_size for b in s.batch_stats) > 1


async def test_reject_timeout_answers_unavailable_while_the_instance_is_busy(client):
    blocker = infer(client, "reject", BLOCKER_ROWS)
    await dispatched(client, "reject", 1)
    err = await failure(infer(client, "reject"))
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert "timed out in the queue" in err.message() and "100000 us" in err.message()
    assert not blocker.done()  # rejected while the other batch was still executing
    await blocker
    s = await stats(client, "reject")
    assert s.execution_count == 1 and s.inference_count == BLOCKER_ROWS  # the rejected one never ran


async def test_a_full_queue_rejects_at_once(client):
    blocker = infer(client, "full", BLOCKER_ROWS)
    await dispatched(client, "full", 1)
    # The queue holds one request: of two sent now, one waits and one is refused.
    calls = [infer(client, "full"), infer(client, "full")]
    done, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
    assert not blocker.done()  # the refusal came at once, not after the blocker
    refused = done.pop()
    err = refused.exception()
    assert isinstance(err, InferenceServerException), f"expected a refusal, got {refused.result()!r}"
    assert err.status() == "StatusCode.UNAVAILABLE" and "maximum queue size" in err.message()
    await blocker
    (queued,) = pending or done
    assert (await queued).as_numpy("OUTPUT0").shape == (1, D)


async def test_high_priority_overtakes_a_backlog_of_low_priority(client):
    order: list[str] = []

    def track(name: str, call: asyncio.Future) -> asyncio.Future:
        call.add_done_callback(lambda _: order.append(name))
        return call

    # No priority parameter: the model's default level 2, the lowest. Each request fills a
    # batch and executes for ~0.4 s, so the backlog is queued long before the first one ends.
    lows = [track(f"low{i}", infer(client, "prio", BLOCKER_ROWS)) for i in range(4)]
    await dispatched(client, "prio", 1)  # one low is executing, the rest queue behind it
    high = track("high", infer(client, "prio", BLOCKER_ROWS, priority=1))
    await asyncio.gather(high, *lows)
    # Only the low that was executing when it arrived finishes before it.
    assert order.index("high") == 1, order


async def test_client_deadline_gives_deadline_exceeded(client):
    blocker = infer(client, "deadline", BLOCKER_ROWS)
    await dispatched(client, "deadline", 1)
    err = await failure(infer(client, "deadline", client_timeout=0.1))  # the gRPC deadline, seconds
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED"
    await blocker
    s = await stats(client, "deadline")
    assert s.execution_count == 1 and s.inference_count == BLOCKER_ROWS  # the late request never ran


async def test_two_instances_run_two_batches_at_once(client):
    first = infer(client, "pair", BLOCKER_ROWS)
    await dispatched(client, "pair", 1)
    sent = time.monotonic()
    # With one instance this would wait for `first` and be rejected by the 100 ms
    # queue timeout; the second instance takes it at once.
    second = infer(client, "pair", BLOCKER_ROWS)
    await dispatched(client, "pair", 2)
    # Both instances are busy now: a third request times out in the queue.
    err = await failure(infer(client, "pair"))
    assert err.status() == "StatusCode.UNAVAILABLE" and "timed out in the queue" in err.message()
    await first
    first_done = time.monotonic()
    await second
    assert first_done - sent > 0.1  # `first` was still executing when `second` was taken
    s = await stats(client, "pair")
    assert s.execution_count == 2 and s.inference_count == 2 * BLOCKER_ROWS
