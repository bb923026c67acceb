"""IterativeQueue: continuous batching's join/leave decision, stepped with made-up times."""

from __future__ import annotations

import pytest

from inferd.scheduling.iterative_queue import CANCELLED, ENDED, LIMIT, IterativeQueue, IterSeq


def seq(key, **kw) -> IterSeq:  # type: ignore[no-untyped-def]
    return IterSeq(key, **kw)


def keys(rows) -> list:  # type: ignore[no-untyped-def]
    return [s.key for s in rows]


def only(step, instance: int = 0) -> list:  # type: ignore[no-untyped-def]
    assert [i for i, _ in step.batches] == [instance], step.batches
    return step.batches[0][1]


def run(q: IterativeQueue, now: float, ended=(), instance: int = 0) -> list:  # type: ignore[no-untyped-def]
    """One step on ``instance``: its rows' keys; rows whose key is in ``ended`` finish."""
    rows = only(q.step(now, [instance]), instance)
    q.complete(instance, rows, [s.key in ended for s in rows], now + 0.001)
    return keys(rows)


def test_finished_sequences_leave_and_waiting_ones_join_between_steps():
    q = IterativeQueue(1, slots=2, max_rows=2)
    for k in "abc":
        q.admit(seq(k), 0.0)
    assert run(q, 0.0) == ["a", "b"]  # c waits: two slots
    assert len(q) == 1
    assert run(q, 0.1, ended={"a"}) == ["a", "b"]  # a ends after this step...
    assert run(q, 0.2) == ["b", "c"]  # ...and c takes its slot at the very next one
    assert q.active() == 2 and len(q) == 0


def test_a_step_runs_at_once_with_whatever_rows_are_there():
    q = IterativeQueue(1, slots=4, max_rows=4)
    q.admit(seq("a"), 0.0)
    assert run(q, 0.0) == ["a"]
    q.admit(seq("b"), 0.05)
    assert run(q, 0.1) == ["a", "b"]


def test_max_steps_ends_a_sequence_after_that_many_steps():
    q = IterativeQueue(1, slots=2, max_rows=2)
    a, b = seq("a", max_steps=2), seq("b")
    q.admit(a, 0.0)
    q.admit(b, 0.0)
    rows = only(q.step(0.0, [0]))
    assert q.complete(0, rows, [False, False], 0.1) == []
    rows = only(q.step(0.1, [0]))
    assert q.complete(0, rows, [False, True], 0.2) == [(a, LIMIT), (b, ENDED)]
    assert q.active() == 0 and a.steps == 2


def test_a_busy_instance_is_not_stepped_until_its_step_completes():
    q = IterativeQueue(1, slots=2, max_rows=2)
    q.admit(seq("a"), 0.0)
    rows = only(q.step(0.0, [0]))
    q.admit(seq("b"), 0.01)
    assert q.step(0.01, [0]).batches == []  # a's step still runs: b joins the next one
    q.complete(0, rows, [False], 0.02)
    assert keys(only(q.step(0.02, [0]))) == ["a", "b"]


def test_cancelled_resident_frees_its_row_at_the_next_step():
    q = IterativeQueue(1, slots=2, max_rows=2)
    a, b, c = seq("a"), seq("b"), seq("c")
    for s in (a, b, c):
        q.admit(s, 0.0)
    rows = only(q.step(0.0, [0]))
    q.complete(0, rows, [False, False], 0.1)
    assert q.cancel(a)
    step = q.step(0.1, [0])
    assert step.left == [a] and keys(only(step)) == ["b", "c"]
    assert not q.cancel(a)  # already gone


def test_cancelled_while_running_leaves_when_the_step_completes():
    q = IterativeQueue(1, slots=2, max_rows=2)
    a = seq("a")
    q.admit(a, 0.0)
    rows = only(q.step(0.0, [0]))
    q.cancel(a)
    assert q.complete(0, rows, [False], 0.1) == [(a, CANCELLED)]
    assert q.active() == 0


def test_cancelled_waiting_sequence_never_joins():
    q = IterativeQueue(1, slots=1, max_rows=1)
    a, b, c = seq("a"), seq("b"), seq("c")
    for s in (a, b, c):
        q.admit(s, 0.0)
    assert run(q, 0.0, ended={"a"}) == ["a"]
    q.cancel(b)
    assert len(q) == 1
    assert run(q, 0.1) == ["c"]


def test_priority_orders_the_joins_then_arrival():
    q = IterativeQueue(1, slots=1, max_rows=1)
    q.admit(seq("low1", level=2), 0.0)
    q.admit(seq("low2", level=2), 0.1)
    q.admit(seq("high", level=1), 0.2)
    order = [run(q, t, ended={"low1", "low2", "high"})[0] for t in (1.0, 2.0, 3.0)]
    assert order == ["high", "low1", "low2"]


def test_more_sequences_than_rows_take_turns():
    # oldest-style: 3 sequences per instance, 2 rows per step
    q = IterativeQueue(1, slots=3, max_rows=2)
    for k in "abc":
        q.admit(seq(k), 0.0)
    seen = [run(q, t) for t in (0.0, 1.0, 2.0, 3.0)]
    assert seen == [["a", "b"], ["a", "c"], ["b", "c"], ["a", "b"]]


def test_rows_of_one_step_share_a_shape():
    q = IterativeQueue(1, slots=3, max_rows=3)
    q.admit(seq("a", shape_key=1), 0.0)
    q.admit(seq("b", shape_key=2), 0.1)
    q.admit(seq("c", shape_key=1), 0.2)
    assert run(q, 1.0) == ["a", "c"]
    assert run(q, 2.0) == ["b"]  # b waited longest now
    assert run(q, 3.0) == ["a", "c"]


def test_sequences_stay_on_their_instance_and_join_free_ones():
    q = IterativeQueue(2, slots=1, max_rows=1)
    a, b = seq("a"), seq("b")
    q.admit(a, 0.0)
    q.admit(b, 0.0)
    step = q.step(0.0, [0, 1])
    assert [(i, keys(r)) for i, r in step.batches] == [(0, ["a"]), (1, ["b"])]
    q.complete(1, step.batches[1][1], [False], 0.1)
    assert q.step(0.1, [1]).batches[0][1] == [b]  # b keeps instance 1
    assert a.instance == 0 and b.instance == 1


def test_minimum_rows_wait_for_the_queue_delay():
    q = IterativeQueue(1, slots=4, max_rows=4, need=2, delay_s=0.5)
    q.admit(seq("a"), 0.0)
    step = q.step(0.1, [0])
    assert step.batches == [] and step.wake_at == 0.5
    q.admit(seq("b"), 0.2)
    assert keys(only(q.step(0.2, [0]))) == ["a", "b"]


def test_delay_passes_with_too_few_rows():
    q = IterativeQueue(1, slots=4, max_rows=4, need=3, delay_s=0.5)
    q.admit(seq("a"), 0.0)
    assert keys(only(q.step(0.5, [0]))) == ["a"]


def test_a_preferred_size_runs_before_the_delay():
    q = IterativeQueue(1, slots=4, max_rows=4, need=4, delay_s=10.0, preferred=[2])
    for k in "abc":
        q.admit(seq(k), 0.0)
    assert keys(only(q.step(0.0, [0]))) == ["a", "b"]


def test_batch_work_is_parked_when_interactive_work_waits_for_a_slot():
    q = IterativeQueue(1, slots=2, max_rows=2)
    j1, j2 = seq("j1", background=True), seq("j2", background=True)
    q.admit(j1, 0.0)
    q.admit(j2, 0.0)
    assert run(q, 0.0) == ["j1", "j2"]
    q.admit(seq("user"), 0.5)
    assert run(q, 1.0) == ["j1", "user"]  # j2 (the later job row) gave its slot up
    assert j2.instance == 0 and len(q) == 1 and j2.steps == 1
    assert run(q, 2.0, ended={"user"}) == ["j1", "user"]
    assert run(q, 3.0) == ["j1", "j2"]  # j2 resumes where it stopped, on its instance
    assert j2.steps == 2
    assert q.background_over_foreground == 0


def test_interactive_work_joins_before_waiting_batch_work():
    q = IterativeQueue(1, slots=1, max_rows=1)
    q.admit(seq("job", background=True), 0.0)
    q.admit(seq("user"), 1.0)
    assert run(q, 2.0, ended={"user"}) == ["user"]
    assert run(q, 3.0) == ["job"]


def test_batch_rows_beside_waiting_interactive_work_are_counted():
    # Interactive work that cannot join (every slot interactive) while a job row
    # runs elsewhere is what the accounting must notice.
    q = IterativeQueue(2, slots=1, max_rows=1)
    q.admit(seq("user1"), 0.0)
    q.admit(seq("job", background=True), 0.0)
    step = q.step(0.0, [0, 1])
    assert [keys(r) for _, r in step.batches] == [["user1"], ["job"]]
    q.complete(1, step.batches[1][1], [False], 0.1)
    q.admit(seq("user2"), 0.1)
    assert keys(only(q.step(0.2, [1]), 1)) == ["user2"]  # the job is parked for it
    assert q.background_over_foreground == 0


@pytest.mark.parametrize("bad", [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_sizes_must_be_positive(bad):
    with pytest.raises(ValueError):
        IterativeQueue(*bad)


def test_a_paused_sequence_keeps_its_slot_and_place_while_the_others_step():
    q = IterativeQueue(1, slots=2, max_rows=2)
    a, b, c = seq("a"), seq("b"), seq("c")
    for s in (a, b, c):
        q.admit(s, 0.0)
    assert run(q, 0.0) == ["a", "b"]
    assert q.pause(a, until=10.0, reason="stalled") and q.paused() == 1
    assert not q.pause(a, until=10.0, reason="stalled")  # paused already
    assert run(q, 0.1) == ["b"]  # a takes no step, and c does not get its slot
    assert run(q, 0.2) == ["b"]
    assert len(q) == 1 and q.active() == 2 and a.steps == 1
    assert q.resume(a) and not q.resume(a)
    assert run(q, 0.3) == ["a", "b"]  # back in the place it held
    assert a.steps == 2 and q.pauses == 1


def test_a_pause_that_runs_out_ends_the_sequence_and_frees_its_slot():
    q = IterativeQueue(1, slots=1, max_rows=1)
    a, b = seq("a"), seq("b")
    q.admit(a, 0.0)
    q.admit(b, 0.0)
    assert run(q, 0.0) == ["a"]
    q.pause(a, until=5.0, reason="stalled")
    step = q.step(1.0, [0])
    assert step.batches == [] and step.expired == [] and step.wake_at == 5.0  # wakes when the pause runs out
    step = q.step(5.0, [0])
    assert step.expired == [a] and a.pause_reason == "stalled"
    assert keys(only(step)) == ["b"]  # b took the slot at once
    assert not q.resume(a)  # a resume arriving after it left changes nothing


def test_a_paused_sequence_still_leaves_when_cancelled():
    q = IterativeQueue(1, slots=2, max_rows=2)
    a, b = seq("a"), seq("b")
    q.admit(a, 0.0)
    q.admit(b, 0.0)
    run(q, 0.0)
    q.pause(a, until=5.0, reason="stalled")
    assert q.cancel(a)
    step = q.step(0.1, [0])
    assert step.left == [a] and step.expired == [] and keys(only(step)) == ["b"]
    assert q.active() == 1 and not q.pause(a, until=9.0, reason="stalled")
