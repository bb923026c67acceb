"""Batch formation with variable lengths: group keys, length buckets and the element budget,
driven through BatchQueue.step with made-up times (no clock, no loop)."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.errors import InvalidArgument
from inferd.scheduling.formation import Grouping
from inferd.scheduling.policy import BatchingPolicy
from inferd.scheduling.queue import BatchQueue, Pending

T0 = 1000.0
PADDED = (("IDS", (0,)),)  # one padded input, its first dimension variable


def queue(max_batch_size: int = 8, delay_us: int = 0, **grouping) -> BatchQueue:  # type: ignore[no-untyped-def]
    g = Grouping(padded=PADDED, reference="IDS", **grouping)
    return BatchQueue(BatchingPolicy(max_batch_size=max_batch_size, batching=True, max_queue_delay_us=delay_us,
                                     grouping=g), "m")


def request(q: BatchQueue, name: str, length: int, rows: int = 1) -> Pending:
    inputs = {"IDS": np.zeros((rows, length), np.int64)}
    key, measured = q.policy.grouping.describe("m", inputs, rows)
    assert measured == length
    return Pending(rows, key, length=length, payload=name)


def admit(q: BatchQueue, now: float, *lengths: tuple[str, int]) -> None:
    for name, length in lengths:
        q.admit(request(q, name, length), now)


def batches(q: BatchQueue, now: float) -> list[list[str]]:
    out: list[list[str]] = []
    while True:
        step = q.step(now, True)
        if not step.batch:
            return out
        out.append([i.payload for i in step.batch])


def test_padding_lets_every_length_share_a_batch():
    q = queue()
    admit(q, T0, ("a", 3), ("b", 50), ("c", 7))
    assert batches(q, T0) == [["a", "b", "c"]]


def test_buckets_never_mix_and_each_bucket_runs_in_arrival_order_of_its_head():
    q = queue(buckets=(16, 64, 256))
    admit(q, T0, ("s1", 5), ("m1", 40), ("s2", 16), ("l1", 200), ("m2", 17), ("s3", 1))
    assert batches(q, T0) == [["s1", "s2", "s3"], ["m1", "m2"], ["l1"]]


def test_a_request_longer_than_the_last_bucket_is_refused_with_the_bound():
    g = Grouping(padded=PADDED, reference="IDS", buckets=(16, 32))
    with pytest.raises(InvalidArgument, match="length 33, longer than the last of inferd.length_buckets \\(32\\)"):
        g.describe("m", {"IDS": np.zeros((1, 33), np.int64)}, 1)


def test_the_budget_bounds_rows_times_longest():
    q = queue(max_elements=100)
    admit(q, T0, *((f"r{i}", 30) for i in range(5)))
    assert batches(q, T0) == [["r0", "r1", "r2"], ["r3", "r4"]]  # 3 x 30 = 90; a 4th row would be 120


def test_a_longer_request_raises_the_cost_of_every_row():
    q = queue(max_elements=100)
    admit(q, T0, ("a", 10), ("b", 10), ("long", 45), ("c", 10))
    # a, b: 2 x 10; long would make 3 x 45 = 135: it waits; c fits (3 x 10).
    assert batches(q, T0) == [["a", "b", "c"], ["long"]]


def test_a_request_alone_over_the_budget_is_refused():
    g = Grouping(padded=PADDED, reference="IDS", max_elements=64)
    with pytest.raises(InvalidArgument, match="2 row\\(s\\) of length 40 \\(80 elements\\) exceed "
                                              "inferd.max_batch_elements \\(64\\)"):
        g.describe("m", {"IDS": np.zeros((2, 40), np.int64)}, 2)


def test_a_long_request_is_never_starved_by_a_stream_of_short_ones():
    # Short requests keep arriving faster than batches run. A long one that does not fit
    # the budget next to them is passed over at most once: then it is the oldest request,
    # and a batch always starts with the oldest.
    q = queue(max_batch_size=4, max_elements=64)
    admit(q, T0, ("s0", 8), ("s1", 8), ("long", 60), ("s2", 8))
    now = T0
    dispatched: list[list[str]] = []
    for i in range(10):
        now += 0.001
        admit(q, now, *((f"n{i}.{j}", 8) for j in range(4)))  # 4 more shorts per step
        step = q.step(now, True)
        dispatched.append([p.payload for p in step.batch])
        if "long" in dispatched[-1]:
            break
    assert dispatched[0] == ["s0", "s1", "s2", "n0.0"]
    assert dispatched[1] == ["long"]  # the very next batch, ahead of every short that came after it


def test_a_budget_that_cannot_grow_runs_at_once_instead_of_waiting_for_the_delay():
    q = queue(delay_us=100_000, max_elements=64)
    admit(q, T0, ("a", 30), ("b", 30), ("c", 30))
    step = q.step(T0, True)
    assert [p.payload for p in step.batch] == ["a", "b"]  # full by elements: no reason to wait
    step = q.step(T0, True)
    assert step.batch == [] and step.wake_at == T0 + 0.1  # "c" alone waits for company


def test_without_padding_only_equal_shapes_share_a_batch():
    g = Grouping()
    keys = [g.describe("m", {"IDS": np.zeros((1, n), np.int64)}, 1)[0] for n in (3, 4, 3)]
    assert keys[0] == keys[2] != keys[1]


def test_ragged_inputs_never_split_a_batch_but_other_inputs_still_must_match():
    g = Grouping(ragged=frozenset({"R"}))
    key = lambda r, x: g.describe("m", {"R": np.zeros((1, r)), "X": np.zeros((1, x))}, 1)[0]  # noqa: E731
    assert key(3, 2) == key(9, 2) != key(3, 5)
