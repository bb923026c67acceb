"""SequenceScheduler (the asyncio driver of the sequence batcher), with fake
instances and a FakeClock: control tensors, implicit state, idle release."""

from __future__ import annotations

import asyncio
from typing import Sequence

import numpy as np
import pytest

from inferd.backends.base import BatchResult, ExecutionTimes, ModelInstance
from inferd.clock import FakeClock
from inferd.config._sequence import Control, SequencePolicy, StateSpec
from inferd.dtypes import BY_CONFIG
from inferd.errors import InvalidArgument, ModelExecutionError
from inferd.observability.stats import ModelStats
from inferd.scheduling.instances import InstanceWorker
from inferd.scheduling.sequence import DelayHooks, SequenceScheduler
from inferd.types import InferenceRequest

WAIT = 10.0
INT32 = BY_CONFIG["TYPE_INT32"]


class Accumulate(ModelInstance):
    """OUTPUT = ACC_OUT = INPUT + ACC_IN per row; records every row it ran."""

    def __init__(self, name: str = "acc") -> None:
        self.name = name
        self.batches: list[list[dict[str, np.ndarray]]] = []
        self.fail: BaseException | None = None

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        self.batches.append([{k: np.array(v) for k, v in row.items()} for row in inputs])
        if self.fail is not None:
            raise self.fail
        outs = []
        for row in inputs:
            total = row["INPUT"] + row["ACC_IN"]
            outs.append({"OUTPUT": total, "ACC_OUT": total})
        return BatchResult(outs, ExecutionTimes(1, 2, 3))

    def close(self) -> None:
        pass


def state() -> StateSpec:
    initial = np.zeros((1,), np.int32)
    initial.flags.writeable = False
    return StateSpec("ACC_IN", "ACC_OUT", INT32, (1,), initial)


def controls(corrid: str = "TYPE_UINT64") -> tuple[Control, ...]:
    return (
        Control("START", "START", INT32, 0, 1),
        Control("END", "END", BY_CONFIG["TYPE_FP32"], 0.0, 1.0),
        Control("READY", "READY", BY_CONFIG["TYPE_BOOL"], False, True),
        Control("CORRID", "CORRID", BY_CONFIG[corrid]),
    )


def make(strategy: str = "direct", max_batch_size: int = 4, instances: int = 1, idle_us: int = 1_000_000,
         corrid: str = "TYPE_UINT64", delay: DelayHooks | None = None,
         **kw) -> tuple[SequenceScheduler, list[Accumulate], FakeClock, ModelStats]:
    policy = SequencePolicy(strategy=strategy, max_batch_size=max_batch_size, idle_us=idle_us,
                            controls=controls(corrid), states=(state(),), corrid_numeric=corrid != "TYPE_STRING",
                            corrid_string=corrid == "TYPE_STRING", **kw)
    fakes = [Accumulate(f"acc_{i}") for i in range(instances)]
    clock = FakeClock()
    stats = ModelStats("acc", 1)
    workers = [InstanceWorker(f, "inline") for f in fakes]
    sched = SequenceScheduler("acc", policy, workers, ["OUTPUT"], stats, clock, delay=delay or DelayHooks())
    return sched, fakes, clock, stats


def request(value: int, seq, start: bool = False, end: bool = False, batch: bool = True) -> InferenceRequest:  # type: ignore[no-untyped-def]
    data = np.array([[value]] if batch else [value], dtype=np.int32)
    params = {"sequence_id": seq, "sequence_start": start, "sequence_end": end}
    return InferenceRequest("acc", {"INPUT": data}, parameters=params)


async def run(sched: SequenceScheduler, value: int, seq, **kw) -> int:  # type: ignore[no-untyped-def]
    out = await asyncio.wait_for(sched.infer(request(value, seq, **kw), 1), WAIT)
    assert set(out) == {"OUTPUT"}  # the state output is the batcher's, never the client's
    return int(out["OUTPUT"].reshape(-1)[0])


async def settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_interleaved_sequences_keep_their_own_running_sums(strategy):
    sched, fakes, _, stats = make(strategy, max_candidate_sequences=4, instances=2)
    sequences = {1: [1, 2, 3, 4], 2: [10, 20, 30], 3: [100, 200, 300, 400, 500]}
    expected = {k: list(np.cumsum(v)) for k, v in sequences.items()}
    got: dict[int, list[int]] = {k: [] for k in sequences}

    async def client(key: int) -> None:
        values = sequences[key]
        for i, v in enumerate(values):
            got[key].append(await run(sched, v, key, start=i == 0, end=i == len(values) - 1))

    await asyncio.gather(*(client(k) for k in sequences))
    assert got == expected
    assert sched.active_sequences() == 0 and stats.inference_count == 12
    await sched.stop()


async def test_requests_sent_without_waiting_run_in_order():
    sched, fakes, _, _ = make("direct")
    tasks = [asyncio.ensure_future(sched.infer(request(v, 7, start=i == 0), 1)) for i, v in enumerate([5, 6, 7])]
    outs = await asyncio.gather(*tasks)
    assert [int(o["OUTPUT"][0, 0]) for o in outs] == [5, 11, 18]
    assert [len(b) for b in fakes[0].batches] == [1, 1, 1]  # one request of a sequence per execution
    await sched.stop()


async def test_control_inputs_and_filler_rows():
    sched, fakes, _, _ = make("direct", max_batch_size=4)
    await asyncio.gather(run(sched, 1, 11, start=True), run(sched, 1, 22, start=True), run(sched, 1, 33, start=True))
    await run(sched, 1, 33, end=True)
    first, last = fakes[0].batches[0], fakes[0].batches[-1]
    assert [int(r["CORRID"][0, 0]) for r in first] == [11, 22, 33]
    assert [int(r["START"][0, 0]) for r in first] == [1, 1, 1]
    assert all(r["READY"].dtype == np.bool_ and r["READY"][0, 0] for r in first)
    # Sequence 33 keeps its row (2): rows 0 and 1 are fillers, READY false.
    assert len(last) == 3
    assert [bool(r["READY"][0, 0]) for r in last] == [False, False, True]
    assert [float(r["END"][0, 0]) for r in last] == [0.0, 0.0, 1.0]
    assert last[2]["END"].dtype == np.float32 and int(last[2]["CORRID"][0, 0]) == 33
    assert int(last[0]["INPUT"][0, 0]) == 0 and int(last[2]["ACC_IN"][0, 0]) == 1
    await sched.stop()


async def test_string_ids_and_a_string_corrid():
    sched, fakes, _, _ = make("oldest", max_candidate_sequences=2, corrid="TYPE_STRING")
    assert await run(sched, 2, "client-a", start=True) == 2
    assert await run(sched, 3, "client-a", end=True) == 5
    assert fakes[0].batches[0][0]["CORRID"][0, 0] == b"client-a"
    await sched.stop()


async def test_a_string_id_for_an_integer_corrid_is_refused():
    sched, _, _, _ = make("direct")
    with pytest.raises(InvalidArgument) as exc:
        await run(sched, 1, "abc", start=True)
    assert "'abc'" in exc.value.message and "CORRID" in exc.value.message
    await sched.stop()


async def test_refusals():
    sched, _, _, _ = make("direct")
    with pytest.raises(InvalidArgument) as exc:
        await run(sched, 1, 5)
    assert exc.value.message == ("inference request for sequence 5 to model 'acc' must specify the START flag on "
                                 "the first request of the sequence")
    with pytest.raises(InvalidArgument) as exc:
        await sched.infer(InferenceRequest("acc", {"INPUT": np.zeros((1, 1), np.int32)}), 1)
    assert "must specify a non-zero or non-empty correlation ID" in exc.value.message
    with pytest.raises(InvalidArgument) as exc:
        await sched.infer(request(1, 5, start=True), 2)
    assert exc.value.message == ("inference request to model 'acc' must specify batch-size 1 due to "
                                 "requirements of sequence batcher")
    assert sched.inflight() == 0
    await sched.stop()


async def test_an_idle_sequence_is_released_on_the_clock():
    sched, _, clock, _ = make("direct", idle_us=500_000)
    assert await run(sched, 4, 9, start=True) == 4
    await settle()
    assert clock.pending_timers() == 1
    clock.advance(0.4)
    assert await run(sched, 1, 9) == 5  # in time: the idle clock starts again
    await settle()
    clock.advance(0.499)
    await settle()
    assert sched.active_sequences() == 1
    clock.advance(0.002)
    await settle()
    assert sched.active_sequences() == 0 and clock.pending_timers() == 0
    with pytest.raises(InvalidArgument) as exc:
        await run(sched, 1, 9)
    assert "must specify the START flag" in exc.value.message and "idle" in exc.value.message
    assert await run(sched, 1, 9, start=True) == 1  # a new sequence starts from the initial state
    await sched.stop()


async def test_start_on_a_live_sequence_resets_its_state():
    sched, _, _, _ = make("direct")
    assert await run(sched, 3, 1, start=True) == 3
    assert await run(sched, 3, 1) == 6
    assert await run(sched, 3, 1, start=True) == 3
    await sched.stop()


async def test_a_failed_execution_fails_its_requests_and_keeps_the_state():
    sched, fakes, _, _ = make("direct")
    assert await run(sched, 3, 1, start=True) == 3
    fakes[0].fail = RuntimeError("boom")
    with pytest.raises(ModelExecutionError) as exc:
        await run(sched, 3, 1)
    assert "boom" in exc.value.message
    fakes[0].fail = None
    assert await run(sched, 3, 1) == 6
    await sched.stop()


async def test_a_cancelled_request_does_not_run():
    sched, fakes, clock, _ = make("direct", minimum_slot_utilization=1.0, max_queue_delay_us=100_000)
    waiting = asyncio.ensure_future(sched.infer(request(1, 1, start=True), 1))
    await settle()
    assert fakes[0].batches == []
    waiting.cancel()
    await settle()
    assert sched.queue_depth() == 0 and sched.inflight() == 0
    clock.advance(0.2)
    await settle()
    assert fakes[0].batches == []
    await sched.stop()


def batch_sizes(stats: ModelStats) -> dict[int, int]:
    return {size: b.compute_infer.count for size, b in stats.batch_stats.items()}


async def test_filler_rows_count_in_the_batch_size_but_are_no_inferences():
    """As Triton reports a direct batch: its size is its rows, fillers included (the model runs
    them), while the inference count is the requests."""
    sched, fakes, _, stats = make("direct", max_batch_size=4)
    await asyncio.gather(run(sched, 1, 11, start=True), run(sched, 1, 22, start=True), run(sched, 1, 33, start=True))
    await run(sched, 1, 33, end=True)
    assert [len(b) for b in fakes[0].batches] == [3, 3]
    assert batch_sizes(stats) == {3: 2}
    assert (stats.execution_count, stats.inference_count) == (2, 4)
    await sched.stop()


async def test_queue_delay_until_every_slot_is_ready_on_the_clock():
    """Triton's qa test_queue_delay_full_min_util, on a FakeClock: max_queue_delay 3 s,
    minimum_slot_utilization 1, TRITONSERVER_DELAY_SCHEDULER=2. Sequence 1001 sends one request;
    1002 one a second later and another two seconds after that. Neither batch fills the slots,
    so each waits for the delay; both have 2 rows."""
    sched, fakes, clock, stats = make("direct", max_queue_delay_us=3_000_000, minimum_slot_utilization=1.0,
                                      delay=DelayHooks(2))
    first = asyncio.ensure_future(sched.infer(request(1, 1001, start=True), 1))
    await settle()
    clock.advance(1.0)
    second = asyncio.ensure_future(sched.infer(request(11, 1002, start=True), 1))
    await settle()
    assert fakes[0].batches == []  # 2 of 4 slots ready, and 1001's request has waited 1 s
    clock.advance(2.0)
    await settle()
    assert [len(b) for b in fakes[0].batches] == [2]  # 1001's request waited the 3 s
    third = asyncio.ensure_future(sched.infer(request(12, 1002), 1))
    await settle()
    clock.advance(2.5)
    await settle()
    assert len(fakes[0].batches) == 1
    clock.advance(0.5)
    outs = await asyncio.wait_for(asyncio.gather(first, second, third), WAIT)
    assert [int(o["OUTPUT"][0, 0]) for o in outs] == [1, 11, 23]
    assert [bool(r["READY"][0, 0]) for r in fakes[0].batches[1]] == [False, True]
    assert batch_sizes(stats) == {2: 2}
    assert (stats.execution_count, stats.inference_count) == (2, 3)
    await sched.stop()
