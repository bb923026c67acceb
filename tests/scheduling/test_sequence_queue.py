"""SequenceQueue (sequence_queue.py): the pure sequence-batcher decision, stepped with made-up times.

Nothing here sleeps or reads a clock: every call gets ``now`` explicitly.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferd.config._sequence import SequencePolicy
from inferd.errors import InvalidArgument
from inferd.scheduling.sequence import sequence_params
from inferd.scheduling.sequence_queue import DelayHooks, SeqItem, SequenceQueue

IDLE_US = 1_000_000
IDLE = IDLE_US / 1e6


def policy(strategy: str = "direct", max_batch_size: int = 4, **kw) -> SequencePolicy:
    kw.setdefault("idle_us", IDLE_US)
    return SequencePolicy(strategy=strategy, max_batch_size=max_batch_size, **kw)


def item(key, start=False, end=False, shape=None) -> SeqItem:  # type: ignore[no-untyped-def]
    return SeqItem(key, start, end, shape)


def keys(rows) -> list:  # type: ignore[no-untyped-def]
    """A batch's rows as sequence ids (None for a filler row)."""
    return [None if seq is None else seq.key for seq, _ in rows]


def only_batch(step, instance: int = 0) -> list:  # type: ignore[no-untyped-def]
    assert [i for i, _ in step.batches] == [instance], step.batches
    return step.batches[0][1]


# -- request parameters -----------------------------------------------------------------


def test_sequence_params_as_tritonclient_sends_them():
    assert sequence_params("m", {"sequence_id": 7, "sequence_start": True}) == (7, True, False)
    assert sequence_params("m", {"sequence_id": "abc", "sequence_end": True}) == ("abc", False, True)
    # An int64 parameter carries a uint64 id: negative values wrap as Triton's cast does.
    assert sequence_params("m", {"sequence_id": -1}) == (2**64 - 1, False, False)


@pytest.mark.parametrize("params, words", [
    ({}, ["model 'm'", "must specify a non-zero or non-empty correlation ID"]),
    ({"sequence_id": 0}, ["non-zero"]),
    ({"sequence_id": ""}, ["non-empty"]),
    ({"sequence_id": 1.5}, ["'sequence_id'", "int64_param"]),
    ({"sequence_id": 1, "sequence_start": 1}, ["'sequence_start'", "bool_param"]),
    ({"sequence_id": 1, "sequence_end": "yes"}, ["'sequence_end'", "bool_param"]),
])
def test_sequence_params_refused(params, words):
    with pytest.raises(InvalidArgument) as exc:
        sequence_params("m", params)
    for word in words:
        assert word in exc.value.message


# -- admission ------------------------------------------------------------------------------


def test_missing_start_is_refused_with_tritons_message():
    q = SequenceQueue(policy(), 1, "acc")
    with pytest.raises(InvalidArgument) as exc:
        q.admit(item(5), 0.0)
    assert exc.value.message == ("inference request for sequence 5 to model 'acc' must specify the START flag "
                                 "on the first request of the sequence")
    assert len(q) == 0 and q.active() == 0


def test_end_closes_the_sequence_at_once():
    q = SequenceQueue(policy(), 1)
    q.admit(item(1, start=True), 0.0)
    q.admit(item(1, end=True), 0.0)
    assert q.active() == 0  # a later request must START a new sequence
    with pytest.raises(InvalidArgument):
        q.admit(item(1), 0.0)
    # Both admitted requests still run, in order, on the same slot.
    s1 = q.step(0.0, [0])
    assert keys(only_batch(s1)) == [1]
    q.complete(only_batch(s1), 0.1)
    s2 = q.step(0.1, [0])
    rows = only_batch(s2)
    assert keys(rows) == [1] and rows[0][1].end
    q.complete(rows, 0.2)
    assert q.step(0.2, [0]).batches == [] and q.slots[0] == [None] * 4


def test_start_and_end_in_one_request():
    q = SequenceQueue(policy(), 1)
    q.admit(item(1, start=True, end=True), 0.0)
    rows = only_batch(q.step(0.0, [0]))
    assert keys(rows) == [1] and q.slots[0] == [None] * 4  # released as it was dispatched
    q.complete(rows, 0.1)
    assert q.active() == 0


def test_a_start_for_a_live_sequence_restarts_it_on_its_slot():
    q = SequenceQueue(policy(), 1)
    first = q.admit(item(1, start=True), 0.0)
    again = q.admit(item(1, start=True), 0.1)
    assert again is first and q.active() == 1
    rows = only_batch(q.step(0.1, [0]))
    q.complete(rows, 0.2)
    rows = only_batch(q.step(0.2, [0]))
    assert rows[0][1].start  # the driver resets the state for this one


# -- direct ------------------------------------------------------------------------------------


def test_direct_gives_each_sequence_a_batch_slot_and_fills_the_gaps():
    q = SequenceQueue(policy("direct", 4), 1)
    for key in (10, 20, 30):
        q.admit(item(key, start=True), 0.0)
    rows = only_batch(q.step(0.0, [0]))
    assert keys(rows) == [10, 20, 30]
    q.complete(rows, 0.1)
    # Only sequence 30 has a request: rows 0 and 1 are fillers, so 30 keeps row 2.
    q.admit(item(30), 0.2)
    rows = only_batch(q.step(0.2, [0]))
    assert keys(rows) == [None, None, 30]
    assert rows[0] == (None, None)


def test_direct_runs_one_request_per_sequence_per_batch_in_order():
    q = SequenceQueue(policy("direct", 4), 1)
    q.admit(item(1, start=True), 0.0)
    q.admit(item(1), 0.0)
    q.admit(item(2, start=True), 0.0)
    rows = only_batch(q.step(0.0, [0]))
    assert keys(rows) == [1, 2] and rows[0][1].start
    assert q.step(0.0, []).batches == []  # the instance is busy
    q.complete(rows, 0.1)
    rows = only_batch(q.step(0.1, [0]))
    assert keys(rows) == [1] and not rows[0][1].start


def test_direct_minimum_slot_utilization_and_delay():
    q = SequenceQueue(policy("direct", 4, minimum_slot_utilization=0.5, max_queue_delay_us=100_000), 1)
    q.admit(item(1, start=True), 0.0)
    step = q.step(0.0, [0])
    assert step.batches == [] and step.wake_at == pytest.approx(0.1)
    q.admit(item(2, start=True), 0.05)  # 2 of 4 slots ready: 50%
    rows = only_batch(q.step(0.05, [0]))
    assert keys(rows) == [1, 2]
    q.complete(rows, 0.06)
    q.admit(item(1), 0.07)
    assert q.step(0.10, [0]).batches == []
    rows = only_batch(q.step(0.17, [0]))  # waited max_queue_delay
    assert keys(rows) == [1]


def test_direct_without_batching_has_one_slot_per_instance():
    q = SequenceQueue(policy("direct", 0), 2)
    q.admit(item(1, start=True), 0.0)
    q.admit(item(2, start=True), 0.0)
    q.admit(item(3, start=True), 0.0)
    assert q.backlog() == 1
    step = q.step(0.0, [0, 1])
    assert sorted((i, keys(rows)) for i, rows in step.batches) == [(0, [1]), (1, [2])]


def test_sequences_are_spread_over_instances_and_stay_on_theirs():
    q = SequenceQueue(policy("direct", 2), 2)
    for key in (1, 2, 3, 4):
        q.admit(item(key, start=True), 0.0)
    assert [[s.key for s in slots] for slots in q.slots] == [[1, 3], [2, 4]]
    step = q.step(0.0, [0, 1])
    for instance, rows in step.batches:
        q.complete(rows, 0.1)
    q.admit(item(4), 0.2)
    q.admit(item(1), 0.2)
    step = q.step(0.2, [0, 1])
    assert sorted((i, keys(rows)) for i, rows in step.batches) == [(0, [1]), (1, [None, 4])]


def test_inputs_of_different_shapes_do_not_share_a_batch():
    q = SequenceQueue(policy("direct", 4), 1)
    q.admit(item(1, start=True, shape=("a", (1, 2))), 0.0)
    q.admit(item(2, start=True, shape=("a", (1, 3))), 0.1)
    rows = only_batch(q.step(0.1, [0]))
    assert keys(rows) == [1, None]  # slot 1 is ready but shaped otherwise: a filler row, as in Triton
    q.complete(rows, 0.2)
    rows = only_batch(q.step(0.2, [0]))
    assert keys(rows) == [None, 2]


# -- backlog ---------------------------------------------------------------------------------------


def test_a_sequence_without_a_free_slot_waits_for_one():
    q = SequenceQueue(policy("direct", 2), 1)
    q.admit(item(1, start=True), 0.0)
    q.admit(item(2, start=True), 0.0)
    q.admit(item(3, start=True), 0.0)
    q.admit(item(3, end=True), 0.0)
    assert q.backlog() == 1
    rows = only_batch(q.step(0.0, [0]))
    assert keys(rows) == [1, 2]
    q.complete(rows, 0.1)
    q.admit(item(1, end=True), 0.2)
    rows = only_batch(q.step(0.2, [0]))
    assert keys(rows) == [1]
    # 1's END is dispatched: its slot went to 3, the oldest in the backlog.
    assert q.backlog() == 0 and q.slots[0][0].key == 3
    q.complete(rows, 0.3)
    rows = only_batch(q.step(0.3, [0]))
    assert keys(rows) == [3] and rows[0][1].start
    q.complete(rows, 0.4)
    rows = only_batch(q.step(0.4, [0]))
    assert keys(rows) == [3] and rows[0][1].end


# -- oldest --------------------------------------------------------------------------------------


def test_oldest_batches_the_oldest_request_of_each_candidate():
    q = SequenceQueue(policy("oldest", 2, max_candidate_sequences=4), 1)
    q.admit(item(1, start=True), 0.0)
    q.admit(item(2, start=True), 0.1)
    q.admit(item(3, start=True), 0.2)
    q.admit(item(1), 0.3)
    rows = only_batch(q.step(0.3, [0]))
    assert keys(rows) == [1, 2]  # oldest first, up to max_batch_size, one per sequence
    q.complete(rows, 0.4)
    rows = only_batch(q.step(0.4, [0]))
    assert keys(rows) == [3, 1]  # 3 arrived at 0.2, 1's second request at 0.3
    assert not rows[1][1].start


def test_oldest_waits_for_a_preferred_batch_size_or_the_delay():
    q = SequenceQueue(policy("oldest", 4, max_candidate_sequences=8, preferred_batch_sizes=(3,),
                             max_queue_delay_us=500_000), 1)
    q.admit(item(1, start=True), 0.0)
    q.admit(item(2, start=True), 0.1)
    step = q.step(0.1, [0])
    assert step.batches == [] and step.wake_at == pytest.approx(0.5)
    q.admit(item(3, start=True), 0.2)
    rows = only_batch(q.step(0.2, [0]))
    assert keys(rows) == [1, 2, 3]
    q.complete(rows, 0.3)
    q.admit(item(2), 0.4)
    assert q.step(0.8, [0]).batches == []
    assert keys(only_batch(q.step(0.9, [0]))) == [2]


def test_oldest_candidates_beyond_the_slots_wait_in_the_backlog():
    q = SequenceQueue(policy("oldest", 4, max_candidate_sequences=2), 1)
    for key in (1, 2, 3):
        q.admit(item(key, start=True, end=True), float(key))
    rows = only_batch(q.step(3.0, [0]))
    assert keys(rows) == [1, 2] and q.slots[0][0].key == 3  # both ended: 3 got a slot at once
    q.complete(rows, 3.1)
    assert keys(only_batch(q.step(3.1, [0]))) == [3]


# -- idle sequences ------------------------------------------------------------------------------


def test_an_idle_sequence_is_released_and_then_refused_with_why():
    q = SequenceQueue(policy("direct", 2), 1, "acc")
    q.admit(item(1, start=True), 0.0)
    rows = only_batch(q.step(0.0, [0]))
    q.complete(rows, 0.5)
    step = q.step(0.5, [0])
    assert step.wake_at == pytest.approx(0.5 + IDLE)
    assert q.step(0.5 + IDLE - 1e-6, [0]).released == []
    step = q.step(0.5 + IDLE, [0])
    assert [s.key for s in step.released] == [1] and step.wake_at is None
    assert q.active() == 0 and q.slots[0] == [None, None]
    with pytest.raises(InvalidArgument) as exc:
        q.admit(item(1), 2.0)
    assert exc.value.message.startswith(
        "inference request for sequence 1 to model 'acc' must specify the START flag on the first request")
    assert "idle" in exc.value.message and "max_sequence_idle_microseconds" in exc.value.message
    # A new START for that id is a new sequence.
    q.admit(item(1, start=True), 2.1)
    assert q.active() == 1


def test_a_request_in_time_keeps_the_sequence_alive():
    q = SequenceQueue(policy("direct", 2), 1)
    q.admit(item(1, start=True), 0.0)
    q.complete(only_batch(q.step(0.0, [0])), 0.0)
    q.admit(item(1), 0.9 * IDLE)
    rows = only_batch(q.step(0.9 * IDLE, [0]))
    # Running or queued work is never idle, however long it takes.
    assert q.step(5 * IDLE, []).released == []
    q.complete(rows, 5 * IDLE)
    step = q.step(5 * IDLE, [0])
    assert step.released == [] and step.wake_at == pytest.approx(6 * IDLE)
    assert [s.key for s in q.step(6 * IDLE, [0]).released] == [1]


def test_a_released_slot_goes_to_the_backlog():
    q = SequenceQueue(policy("direct", 0), 1)
    q.admit(item(1, start=True), 0.0)
    q.complete(only_batch(q.step(0.0, [0])), 0.0)
    q.admit(item(2, start=True), 0.1)
    assert q.step(0.1, [0]).batches == [] and q.backlog() == 1  # 1 holds the only slot
    step = q.step(IDLE, [0])
    assert [s.key for s in step.released] == [1]
    assert keys(only_batch(step)) == [2]


def test_only_the_last_ids_are_remembered_as_released(monkeypatch):
    from inferd.scheduling import sequence_queue

    monkeypatch.setattr(sequence_queue, "RELEASED_MEMORY", 8)
    q = SequenceQueue(policy("oldest", 1, max_candidate_sequences=100), 1)
    n = 18
    for key in range(1, n + 1):
        q.admit(item(key, start=True), 0.0)
    while len(q):
        step = q.step(0.0, [0])
        q.complete(only_batch(step), 0.0)
    assert len(q.step(IDLE, [0]).released) == n
    with pytest.raises(InvalidArgument) as old:
        q.admit(item(1), IDLE)
    with pytest.raises(InvalidArgument) as recent:
        q.admit(item(n), IDLE)
    assert "idle" not in old.value.message and "idle" in recent.value.message


# -- cancellation ------------------------------------------------------------------------------------


def test_a_cancelled_request_never_runs_and_a_cancelled_end_still_ends():
    q = SequenceQueue(policy("direct", 2), 1)
    seq = q.admit(item(1, start=True), 0.0)
    doomed = item(1, end=True)
    q.admit(doomed, 0.0)
    q.admit(item(2, start=True), 0.0)
    rows = only_batch(q.step(0.0, [0]))
    assert keys(rows) == [1, 2]
    assert q.cancel(doomed, seq, 0.05) and not q.cancel(doomed, seq, 0.05)
    q.complete(rows, 0.1)
    assert q.slots[0][0] is None  # its END will never run: the slot is free
    assert keys(only_batch(q.step(0.1, [0])) if q.step(0.1, []).batches else []) == []
    assert len(q) == 0


def test_direct_filler_rows_are_plain_none_pairs():
    q = SequenceQueue(policy("direct", 3), 1)
    for key in (1, 2, 3):
        q.admit(item(key, start=True), 0.0)
    q.complete(only_batch(q.step(0.0, [0])), 0.1)
    q.admit(item(3), 0.2)
    rows = only_batch(q.step(0.2, [0]))
    assert rows[:2] == [(None, None), (None, None)] and rows[2][1] is not None
    assert np.array_equal([r[0] is None for r in rows], [True, True, False])


# -- Triton's delay hooks (TRITONSERVER_DELAY_SCHEDULER, _BACKLOG_DELAY_SCHEDULER) -------------------


def test_delay_hooks_are_read_as_triton_reads_them():
    assert DelayHooks.from_env({}) == DelayHooks(0, 0) and not DelayHooks().active
    env = {"TRITONSERVER_DELAY_SCHEDULER": "12", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": " 2 "}
    assert DelayHooks.from_env(env) == DelayHooks(12, 2)
    assert DelayHooks.from_env({"TRITONSERVER_DELAY_SCHEDULER": "x"}) == DelayHooks(0, 0)
    assert not DelayHooks(0, 5).active  # the backlog hook acts only with the delay hook


def test_direct_delay_holds_every_instance_until_the_count_then_lets_all_go():
    q = SequenceQueue(policy(max_batch_size=2), 2, delay=DelayHooks(4))
    for n, key in enumerate([1, 2, 3]):
        q.admit(item(key, start=True), float(n))
        assert q.step(float(n), [0, 1]).batches == []
    q.admit(item(1), 3.0)  # the 4th queued request (sequences 1 and 3 on instance 0, 2 on 1)
    step = q.step(3.0, [0, 1])
    assert sorted((i, keys(rows)) for i, rows in step.batches) == [(0, [1, 3]), (1, [2])]
    q.complete(dict(step.batches)[1], 3.5)
    q.admit(item(2), 4.0)  # once let go, an instance never waits again
    assert [keys(rows) for _, rows in q.step(4.0, [1]).batches] == [[2]]


def test_backlog_delay_also_waits_for_the_backlog():
    q = SequenceQueue(policy(max_batch_size=2), 1, delay=DelayHooks(1, 2))
    q.admit(item(1, start=True), 0.0)
    q.admit(item(2, start=True), 0.0)
    q.admit(item(3, start=True), 0.0)  # no free slot: the backlog
    assert q.step(0.0, [0]).batches == [] and q.backlog() == 1
    q.admit(item(3, end=True), 1.0)
    assert keys(only_batch(q.step(1.0, [0]))) == [1, 2]


def test_oldest_delay_counts_each_instances_ready_sequences():
    q = SequenceQueue(policy("oldest", max_candidate_sequences=2), 2, delay=DelayHooks(2))
    for key in (1, 2, 3):  # 1 and 3 on instance 0, 2 on instance 1
        q.admit(item(key, start=True), 0.0)
    step = q.step(0.0, [0, 1])
    assert [(i, sorted(keys(rows))) for i, rows in step.batches] == [(0, [1, 3])]


# -- variable-size implicit state ----------------------------------------------------------------------


def test_rows_whose_states_differ_in_shape_never_share_a_batch():
    q = SequenceQueue(policy(), 1, initial_state_key=((1, 1),))
    for key in (1, 2, 3):
        q.admit(item(key, start=True), 0.0)
    first = only_batch(q.step(0.0, [0]))
    assert keys(first) == [1, 2, 3]  # every START runs with the initial state's shape
    first[0][0].state_key = ((1, 3),)
    first[1][0].state_key = ((1, 2),)
    first[2][0].state_key = ((1, 3),)
    q.complete(first, 1.0)
    for key in (1, 2, 3):
        q.admit(item(key), 2.0)
    assert keys(only_batch(q.step(2.0, [0]))) == [1, None, 3]  # sequence 2 waits for its own batch
