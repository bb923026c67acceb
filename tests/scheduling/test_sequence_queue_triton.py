"""SequenceQueue's ``direct`` batches as Triton's sequence batcher forms them, on the scenarios of
Triton's qa/L0_sequence_batcher that run under its delay hooks (TRITONSERVER_DELAY_SCHEDULER,
TRITONSERVER_BACKLOG_DELAY_SCHEDULER) or with ``max_queue_delay_microseconds`` and
``minimum_slot_utilization``: which rows share a batch, and how many rows the model sees.

What Triton does (core: sequence_batch_scheduler.cc, DirectSequenceBatch): a batch spans rows
0..the highest slot with a request ready; its shapes are those of the request in the *lowest*
ready slot; every other row (a slot with nothing ready, or a request whose shapes differ) is a
filler with READY false, and still a row of the batch. It runs at once unless both
``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` are set; then it waits until
the ready slots, whatever their shapes, reach that share of the slots, or until the oldest ready
request has waited the delay.

Pure: nothing sleeps; every call gets its (made-up) time.
"""

from __future__ import annotations

import pytest

from inferd.config._sequence import SequencePolicy
from inferd.scheduling.sequence_queue import DelayHooks, SeqItem, SequenceQueue


def policy(max_batch_size: int = 4, **kw) -> SequencePolicy:
    return SequencePolicy(strategy="direct", max_batch_size=max_batch_size, idle_us=5_000_000, **kw)


def keys(rows) -> list:  # type: ignore[no-untyped-def]
    """A batch's rows as sequence ids (None for a filler row)."""
    return [None if seq is None else seq.key for seq, _ in rows]


def send(q: SequenceQueue, key: int, count: int, at: float, shape: object = None,
         end: bool = True) -> None:
    """A sequence's ``count`` requests, all at ``at`` (one stream, sent without waiting), START
    on the first and, with ``end``, END on the last; nothing may run while the hooks hold."""
    for i in range(count):
        q.admit(SeqItem(key, start=i == 0, end=end and i == count - 1, shape_key=shape), at)


def run_one(q: SequenceQueue, now: float) -> list | None:
    """Form at most one batch on instance 0 and complete it at ``now``: its rows, or None."""
    step = q.step(now, [0])
    if not step.batches:
        return None
    [(instance, rows)] = step.batches
    q.complete(rows, now)
    return keys(rows)


def drain(q: SequenceQueue, now: float) -> list[list]:
    """Every batch that runs at ``now``, one after the other (each completes before the next forms)."""
    batches = []
    while (rows := run_one(q, now)) is not None:
        batches.append(rows)
    return batches


# -- how a direct batch is formed -----------------------------------------------------------------


def test_the_batch_reaches_the_highest_ready_slot_whatever_its_shape():
    q = SequenceQueue(policy(), 1)
    send(q, 1, 1, 0.0, shape="a")
    send(q, 2, 1, 0.0, shape="a")
    send(q, 3, 1, 0.0, shape="b")
    # Slot 2's request cannot join (its shapes differ) but its row is there, a filler.
    assert drain(q, 0.0) == [[1, 2, None], [None, None, 3]]


def test_the_lowest_ready_slot_gives_the_batch_its_shapes_not_the_oldest_request():
    q = SequenceQueue(policy(), 1)
    send(q, 1, 1, 0.0, shape="a", end=False)  # slot 0
    send(q, 2, 2, 0.0, shape="b", end=False)  # slot 1: its second request waits from t=0
    assert run_one(q, 0.0) == [1, None]
    assert run_one(q, 0.1) == [None, 2]
    q.admit(SeqItem(1, shape_key="a"), 0.2)  # newer than sequence 2's, in a lower slot
    assert run_one(q, 0.2) == [1, None]
    assert run_one(q, 0.2) == [None, 2]


def test_minimum_slot_utilization_counts_every_ready_slot_whatever_its_shape():
    q = SequenceQueue(policy(minimum_slot_utilization=0.5, max_queue_delay_us=3_000_000), 1)
    send(q, 1, 1, 0.0, shape="a")
    send(q, 2, 1, 0.0, shape="b")
    assert run_one(q, 0.0) == [1, None]  # 2 of 4 slots ready: at once, though only 1 row shares the shape
    # Now 1 of 4 is ready: it waits for the delay, counted from its own arrival.
    step = q.step(0.0, [0])
    assert step.batches == [] and step.wake_at == pytest.approx(3.0)
    assert run_one(q, 3.0) == [None, 2]


# -- qa/L0_sequence_batcher, the delay-hook tests that compose batches ----------------------------


def test_backlog_fill_no_end():
    """Four slots, TRITONSERVER_DELAY_SCHEDULER=10, TRITONSERVER_BACKLOG_DELAY_SCHEDULER=3: four
    sequences hold the slots (10 requests), two more wait in the backlog (3 requests before the
    last one's END, sent later). Ended sequences hand their slots to the backlog at once; the
    last sequence, alone in slot 2, runs in batches of 3 rows (Triton expects {4: 3, 3: 2})."""
    q = SequenceQueue(policy(), 1, delay=DelayHooks(10, 3))
    for t, (key, count) in enumerate([(1001, 3), (1002, 2), (1003, 2), (1004, 3), (1005, 1)]):
        send(q, key, count, float(t))
        assert run_one(q, float(t)) is None
    send(q, 1006, 2, 5.0, end=False)  # the backlog hook is met with its second request
    assert drain(q, 5.0) == [[1001, 1002, 1003, 1004], [1001, 1002, 1003, 1004],
                             [1001, 1005, 1006, 1004], [None, None, 1006]]
    q.admit(SeqItem(1006, end=True), 7.0)
    assert drain(q, 7.0) == [[None, None, 1006]]


def test_ragged_batch():
    """Four slots, TRITONSERVER_DELAY_SCHEDULER=12, four sequences of three requests whose inputs
    are shaped [2], [2], [1], [3] (the fourth sent later): requests of different shapes never
    share a batch, and every batch has 4 rows, up to the last sequence's slot (Triton expects
    {4: 9})."""
    q = SequenceQueue(policy(), 1, delay=DelayHooks(12))
    for key, shape in ((1001, (2,)), (1002, (2,)), (1003, (1,))):
        send(q, key, 3, 0.0, shape=shape)
    assert run_one(q, 0.0) is None
    send(q, 1004, 3, 3.0, shape=(3,))
    batches = drain(q, 3.0)
    assert batches == ([[1001, 1002, None, None]] * 3 + [[None, None, 1003, None]] * 3
                       + [[None, None, None, 1004]] * 3)


# qa/L0_sequence_batcher's queue-delay models: direct, max_queue_delay_microseconds 3 s, one
# instance of batch size 4, TRITONSERVER_DELAY_SCHEDULER=2. Sequence 1001 sends one request at
# t=0; 1002 starts at t=1 with two. Triton expects two batches of 2 rows each: [1001, 1002],
# then [filler, 1002].


def queue_delay(minimum_slot_utilization: float) -> SequenceQueue:
    return SequenceQueue(policy(max_queue_delay_us=3_000_000, minimum_slot_utilization=minimum_slot_utilization),
                         1, delay=DelayHooks(2))


def test_queue_delay_no_min_util():
    q = queue_delay(0.0)  # no utilization asked: the delay is never waited
    send(q, 1001, 1, 0.0, end=False)
    assert run_one(q, 0.0) is None
    send(q, 1002, 2, 1.0, end=False)
    assert drain(q, 1.0) == [[1001, 1002], [None, 1002]]


def test_queue_delay_half_min_util():
    q = queue_delay(0.5)
    send(q, 1001, 1, 0.0, end=False)
    send(q, 1002, 2, 1.0, end=False)
    assert run_one(q, 1.0) == [1001, 1002]  # 2 of 4 slots: half
    step = q.step(1.0, [0])
    assert step.batches == [] and step.wake_at == pytest.approx(4.0)  # 1 of 4: 1002's second waits 3 s
    assert run_one(q, 3.999) is None
    assert run_one(q, 4.0) == [None, 1002]


def test_queue_delay_full_min_util():
    q = queue_delay(1.0)
    send(q, 1001, 1, 0.0, end=False)
    send(q, 1002, 1, 1.0, end=False)
    step = q.step(1.0, [0])
    assert step.batches == [] and step.wake_at == pytest.approx(3.0)  # 1001's request is the oldest
    q.admit(SeqItem(1002), 3.0)  # 1002's second request, sent 2 s later
    assert run_one(q, 3.0) == [1001, 1002]
    assert q.step(3.0, [0]).wake_at == pytest.approx(6.0)
    assert run_one(q, 6.0) == [None, 1002]
