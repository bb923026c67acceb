"""Dynamic batching, queue policies, priorities and instance groups, end to end:
tritonclient (gRPC, asyncio) against a real ``inferd serve``.

Scenarios that need a busy instance hold it with a gated Python model
(tests/gated_model.py): its execution starts (the gate's ``started.<n>``) and waits
until the test releases it, so "the instance is busy" and "the requests are
queued" (the model's pending count in /metrics) are facts the test waits for, not
guesses about how long an execution takes. Orders are read from the gate (each
execution records the requests it ran). Each scenario has its own model and gate,
so statistics never mix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, running
from gated_model import add_gated_model, executions, release, wait_pending_async, wait_started_async

D = 4  # the models' input and output width

REJECT_100MS = "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 }"

MODELS = {
    # name: (max_batch_size, dynamic_batching body, instance count)
    "batched": (64, "max_queue_delay_microseconds: 100000", 1),
    "reject": (8, REJECT_100MS, 1),
    "full": (8, "default_queue_policy { max_queue_size: 1 }", 1),
    "prio": (1, "priority_levels: 2 default_priority_level: 2", 1),  # one request an execution: orders are exact
    "deadline": (8, "", 1),
    "pair": (8, REJECT_100MS, 2),
}


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batching_gates")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gates: Path):
    repo = tmp_path_factory.mktemp("batching_repo")
    for name, (mbs, db, count) in MODELS.items():
        add_gated_model(repo, name, gates / name, max_batch_size=mbs, dims=(D,), count=count,
                        extra=f"dynamic_batching {{ {db} }}\n")
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


def infer(client, model: str, rows: int = 1, value: float = 0.0, **kw) -> asyncio.Future:  # type: ignore[no-untyped-def]
    return asyncio.ensure_future(client.infer(model, inputs(rows, value), **kw))


async def stats(client, model: str):  # type: ignore[no-untyped-def]
    return (await client.get_inference_statistics(model)).model_stats[0]


async def failure(call: asyncio.Future) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        await call
    return info.value


async def test_concurrent_requests_are_batched(client, server, gates):
    # One request holds the instance while fifteen queue behind it; released, the queue is
    # free to run them together: fewer executions than requests, whatever the machine's load.
    first = infer(client, "batched", value=-1)
    await wait_started_async(gates / "batched")
    rest = [infer(client, "batched", value=i) for i in range(15)]
    await wait_pending_async(server.metrics_url, "batched", 15)
    release(gates / "batched")
    results = await asyncio.gather(first, *rest)
    assert [r.as_numpy("OUTPUT0")[0, 0] for r in results] == [-1, *range(15)]
    s = await stats(client, "batched")
    assert s.inference_count == 16
    assert 2 <= s.execution_count < s.inference_count
    assert sum(b.compute_infer.count for b in s.batch_stats) == s.execution_count
    assert max(b.batch_size for b in s.batch_stats) > 1
    assert sorted(v for e in executions(gates / "batched") for v in e) == [-1, *range(15)]


async def test_reject_timeout_answers_unavailable_while_the_instance_is_busy(client, gates):
    blocker = infer(client, "reject")
    await wait_started_async(gates / "reject")
    err = await failure(infer(client, "reject"))
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert "timed out in the queue" in err.message() and "100000 us" in err.message()
    assert not blocker.done()  # rejected while the other batch was still executing (held by the gate)
    release(gates / "reject")
    await blocker
    s = await stats(client, "reject")
    assert s.execution_count == 1 and s.inference_count == 1  # the rejected one never ran


async def test_a_full_queue_rejects_at_once(client, gates):
    blocker = infer(client, "full")
    await wait_started_async(gates / "full")
    # The queue holds one request: of two sent now, one waits and one is refused.
    calls = [infer(client, "full"), infer(client, "full")]
    done, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
    assert not blocker.done()  # the refusal came while the blocker was held, not after it
    refused = done.pop()
    err = refused.exception()
    assert isinstance(err, InferenceServerException), f"expected a refusal, got {refused.result()!r}"
    assert err.status() == "StatusCode.UNAVAILABLE" and "maximum queue size" in err.message()
    release(gates / "full")
    await blocker
    (queued,) = pending or done
    assert (await queued).as_numpy("OUTPUT0").shape == (1, D)


async def test_high_priority_overtakes_a_backlog_of_low_priority(client, server, gates):
    # No priority parameter: the model's default level 2, the lowest. The first low holds the
    # instance; three more queue behind it, then the high one; released, the high one runs next.
    lows = [infer(client, "prio", value=0)]
    await wait_started_async(gates / "prio")
    for i in range(1, 4):  # one at a time: the order they queue in is the test's, not the transport's
        lows.append(infer(client, "prio", value=i))
        await wait_pending_async(server.metrics_url, "prio", i)
    high = infer(client, "prio", value=100, priority=1)
    await wait_pending_async(server.metrics_url, "prio", 4)
    release(gates / "prio")
    await asyncio.gather(high, *lows)
    # Only the low that was executing when it arrived ran before it; the backlog kept its order.
    assert executions(gates / "prio") == [[0], [100], [1], [2], [3]]


async def test_client_deadline_gives_deadline_exceeded(client, gates):
    blocker = infer(client, "deadline")
    await wait_started_async(gates / "deadline")
    err = await failure(infer(client, "deadline", client_timeout=0.1))  # the gRPC deadline, seconds
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED"
    release(gates / "deadline")
    await blocker
    s = await stats(client, "deadline")
    assert s.execution_count == 1 and s.inference_count == 1  # the late request never ran


async def test_two_instances_run_two_batches_at_once(client, gates):
    first = infer(client, "pair", value=1)
    await wait_started_async(gates / "pair")
    # With one instance this would wait for `first` and be rejected by the 100 ms queue
    # timeout; the second instance takes it while the first still executes (held).
    second = infer(client, "pair", value=2)
    await wait_started_async(gates / "pair", 2)
    assert not first.done()
    # Both instances are busy now: a third request times out in the queue.
    err = await failure(infer(client, "pair"))
    assert err.status() == "StatusCode.UNAVAILABLE" and "timed out in the queue" in err.message()
    release(gates / "pair")
    await asyncio.gather(first, second)
    assert executions(gates / "pair") == [[1], [2]]
    s = await stats(client, "pair")
    assert s.execution_count == 2 and s.inference_count == 2
