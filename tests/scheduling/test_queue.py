"""BatchQueue, the pure batch decision: made-up times, no clock, no loop, no sleeps.

Times are float seconds; ``T0`` is an arbitrary origin. Each test admits
requests at chosen times and calls ``step(now, can_dispatch)`` the way the
driver would, then checks the batch, the expired requests and ``wake_at``.
"""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from inferd._proto import model_config_pb2 as mc
from inferd.errors import ConfigError, DeadlineExceeded, Unavailable
from inferd.config import model_spec
from inferd.scheduling import policy as policy_module
from inferd.scheduling.policy import DELAY, REJECT, BatchingPolicy, QueuePolicy
from inferd.scheduling.adaptive import Instance
from inferd.scheduling.estimates import ExecutionModel
from inferd.scheduling.queue import BatchQueue, Pending, split_rows

T0 = 1000.0
MS = 1e-3


def policy(**kw) -> BatchingPolicy:
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("batching", True)
    return BatchingPolicy(**kw)


def req(name: str, rows: int = 1, shape=None, **kw) -> Pending:
    return Pending(rows, shape, payload=name, **kw)


def names(items) -> list[str]:
    return [i.payload for i in items]


def admit(q: BatchQueue, now: float, *items: Pending) -> list[Pending]:
    for item in items:
        q.admit(item, now)
    return list(items)


def drain(q: BatchQueue, now: float) -> list[list[str]]:
    """Dispatch until the queue holds nothing runnable at ``now``."""
    out = []
    while True:
        step = q.step(now, True)
        if not step.batch:
            return out
        out.append(names(step.batch))


# -- preferred sizes and the queue delay ------------------------------------------


def test_preferred_size_runs_at_once_and_waits_otherwise():
    q = BatchQueue(policy(preferred_batch_sizes=(4,), max_queue_delay_us=100_000))
    admit(q, T0, req("a"), req("b"), req("c"))
    step = q.step(T0, True)
    assert step.batch == [] and step.wake_at == T0 + 0.1  # 3 rows: not preferred, wait
    admit(q, T0 + 10 * MS, req("d"))
    step = q.step(T0 + 10 * MS, True)
    assert names(step.batch) == ["a", "b", "c", "d"]  # 4 rows: preferred, well before the delay
    assert len(q) == 0


def test_preferred_size_takes_the_largest_preferred_prefix():
    q = BatchQueue(policy(preferred_batch_sizes=(2, 4), max_queue_delay_us=100_000))
    admit(q, T0, *(req(n) for n in "abcde"))
    step = q.step(T0, True)
    assert names(step.batch) == ["a", "b", "c", "d"]
    step = q.step(T0, True)  # "e" alone is no preferred size: it waits out its own delay
    assert step.batch == [] and step.wake_at == T0 + 0.1
    assert names(q.step(T0 + 0.1, True).batch) == ["e"]


def test_head_alone_at_a_preferred_size_runs_at_once():
    q = BatchQueue(policy(preferred_batch_sizes=(6,), max_queue_delay_us=100_000))
    admit(q, T0, req("six", rows=6))
    assert names(q.step(T0, True).batch) == ["six"]


def test_max_queue_delay_wakes_at_head_arrival_plus_delay_and_dispatches_then():
    q = BatchQueue(policy(max_queue_delay_us=100_000))
    admit(q, T0, req("a"))
    admit(q, T0 + 30 * MS, req("b"))
    step = q.step(T0 + 30 * MS, True)
    assert step.batch == [] and step.expired == []
    assert step.wake_at == T0 + 100_000 / 1e6  # the head's arrival + delay, not the newest one's
    step = q.step(T0 + 99 * MS, True)
    assert step.batch == [] and step.wake_at == T0 + 0.1
    step = q.step(T0 + 0.1, True)
    assert names(step.batch) == ["a", "b"]
    assert step.wake_at is None  # nothing left: nothing to wake for


def test_a_full_batch_does_not_wait_for_the_delay():
    q = BatchQueue(policy(max_batch_size=4, max_queue_delay_us=1_000_000))
    admit(q, T0, *(req(n) for n in "abcdef"))
    assert names(q.step(T0, True).batch) == ["a", "b", "c", "d"]
    step = q.step(T0, True)
    assert step.batch == [] and step.wake_at == T0 + 1.0


def test_no_delay_runs_whatever_is_queued():
    q = BatchQueue(policy())
    admit(q, T0, req("a"), req("b"))
    assert names(q.step(T0, True).batch) == ["a", "b"]


def test_a_batch_that_cannot_grow_runs_without_waiting_for_the_delay():
    # The next request (same shape) does not fit and must keep its place, so
    # the batch can never grow: waiting out the delay would only add latency.
    q = BatchQueue(policy(max_batch_size=8, max_queue_delay_us=1_000_000))
    admit(q, T0, req("five", rows=5), req("four", rows=4))
    step = q.step(T0, True)
    assert names(step.batch) == ["five"]
    step = q.step(T0, True)  # "four" may still grow: it waits
    assert step.batch == [] and step.wake_at == T0 + 1.0


def test_no_dispatch_without_a_free_instance():
    q = BatchQueue(policy())
    admit(q, T0, req("a"))
    step = q.step(T0, False)
    assert step.batch == [] and step.wake_at is None  # the driver steps again when an instance frees
    assert names(q.step(T0 + 5, True).batch) == ["a"]


# -- rows and shapes --------------------------------------------------------------


def test_a_requests_own_rows_count_toward_the_batch():
    q = BatchQueue(policy(max_batch_size=8))
    admit(q, T0, req("six", rows=6), req("two", rows=2), req("one"))
    step = q.step(T0, True)
    assert names(step.batch) == ["six", "two"]  # 6 + 2 fills 8 exactly
    assert sum(i.rows for i in step.batch) == 8
    assert names(q.step(T0, True).batch) == ["one"]


def test_a_six_row_request_fills_six_of_eight():
    q = BatchQueue(policy(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=100_000))
    admit(q, T0, req("six", rows=6), req("a"))
    step = q.step(T0, True)
    assert step.batch == []  # 7 rows: short of the preferred 8
    admit(q, T0 + MS, req("b"))
    assert names(q.step(T0 + MS, True).batch) == ["six", "a", "b"]


def test_different_shapes_never_share_a_batch():
    q = BatchQueue(policy())
    admit(q, T0, req("a1", shape=("A",)), req("b1", shape=("B",)), req("a2", shape=("A",)), req("b2", shape=("B",)))
    assert drain(q, T0) == [["a1", "a2"], ["b1", "b2"]]


def test_the_head_always_runs_even_when_other_shapes_could_fill_a_batch():
    q = BatchQueue(policy(max_batch_size=4, max_queue_delay_us=50_000))
    admit(q, T0, req("a", shape=("A",)), *(req(f"b{i}", shape=("B",)) for i in range(6)))
    step = q.step(T0, True)
    assert step.batch == [] and step.wake_at == T0 + 0.05  # the head's batch waits; B does not jump it
    assert names(q.step(T0 + 0.05, True).batch) == ["a"]
    assert names(q.step(T0 + 0.05, True).batch) == ["b0", "b1", "b2", "b3"]


def test_a_batching_model_without_dynamic_batching_runs_one_request_at_a_time():
    q = BatchQueue(BatchingPolicy(max_batch_size=8))  # no dynamic_batching: batching=False
    admit(q, T0, req("a", rows=3), req("b", rows=2))
    assert drain(q, T0) == [["a"], ["b"]]


# -- ordering ------------------------------------------------------------------------


def test_fifo_within_a_level():
    q = BatchQueue(policy(max_batch_size=1))
    for i, n in enumerate("abcdef"):
        admit(q, T0 + i * MS, req(n))
    assert drain(q, T0 + 0.01) == [[n] for n in "abcdef"]


def test_fifo_inside_a_batch():
    q = BatchQueue(policy())
    for i, n in enumerate("abcd"):
        admit(q, T0 + i * MS, req(n))
    assert drain(q, T0 + 0.01) == [["a", "b", "c", "d"]]


# -- priority ------------------------------------------------------------------------


def test_level_one_is_served_first():
    q = BatchQueue(policy(max_batch_size=1, priority_levels=3, default_priority_level=2))
    admit(q, T0, req("low", priority=3), req("default", priority=0), req("high", priority=1))
    assert drain(q, T0) == [["high"], ["default"], ["low"]]


def test_priority_zero_or_out_of_range_gets_the_default_level():
    q = BatchQueue(policy(priority_levels=3, default_priority_level=2))
    zero, beyond, given = admit(q, T0, req("zero", priority=0), req("beyond", priority=7), req("given", priority=3))
    assert (zero.level, beyond.level, given.level) == (2, 2, 3)
    assert q.depth(2) == 2 and q.depth(3) == 1 and q.depth(1) == 0


def test_a_batch_takes_high_priority_requests_first():
    q = BatchQueue(policy(max_batch_size=2, priority_levels=2))
    admit(q, T0, req("l1", priority=2), req("l2", priority=2), req("h1", priority=1), req("h2", priority=1))
    assert drain(q, T0) == [["h1", "h2"], ["l1", "l2"]]


# -- aging ---------------------------------------------------------------------------


def test_aging_promotes_one_level_per_interval():
    # aging 100 ms: the level-3 request counts as level 2 from T0+0.1, level 1 from T0+0.2.
    q = BatchQueue(policy(max_batch_size=1, priority_levels=3, aging_us=100_000))
    admit(q, T0, req("old-low", priority=3))
    admit(q, T0 + 0.05, req("mid", priority=2))
    # Before one interval: level 3 against level 2.
    assert names(q.step(T0 + 0.09, True).batch) == ["mid"]
    admit(q, T0 + 0.095, req("mid2", priority=2))
    # After one interval it is level 2 too, and older: it goes first.
    assert names(q.step(T0 + 0.1, True).batch) == ["old-low"]
    assert names(q.step(T0 + 0.1, True).batch) == ["mid2"]


def test_aging_eventually_overtakes_newer_high_priority_requests():
    q = BatchQueue(policy(max_batch_size=1, priority_levels=3, aging_us=100_000))
    admit(q, T0, req("low", priority=3))
    admit(q, T0 + 0.15, req("high", priority=1))
    assert names(q.step(T0 + 0.15, True).batch) == ["high"]  # low counts as level 2 here
    admit(q, T0 + 0.19, req("high2", priority=1))
    assert names(q.step(T0 + 0.2, True).batch) == ["low"]  # level 1 now, and older than high2


def test_aging_never_starves_a_low_priority_request():
    q = BatchQueue(policy(max_batch_size=1, priority_levels=3, aging_us=100_000))
    admit(q, T0, req("low", priority=3))
    served_at = None
    # Two high-priority requests arrive every 10 ms, one request runs: a growing backlog.
    for tick in range(1, 100):
        now = T0 + tick * 0.01
        admit(q, now, req(f"h{tick}a", priority=1), req(f"h{tick}b", priority=1))
        batch = names(q.step(now, True).batch)
        if batch == ["low"]:
            served_at = now
            break
    assert served_at is not None and served_at == pytest.approx(T0 + 0.2)


def test_without_aging_priority_is_strict():
    q = BatchQueue(policy(max_batch_size=1, priority_levels=3))
    admit(q, T0, req("low", priority=3))
    for tick in range(1, 50):
        now = T0 + tick
        admit(q, now, req(f"h{tick}", priority=1))
        assert names(q.step(now, True).batch) == [f"h{tick}"]


# -- queue policies ------------------------------------------------------------------


def test_reject_timeout_while_waiting_returns_unavailable_naming_the_limit():
    qp = QueuePolicy(timeout_action=REJECT, default_timeout_us=50_000)
    q = BatchQueue(policy(default_queue_policy=qp), model="m")
    (a,) = admit(q, T0, req("a"))
    step = q.step(T0, False)  # the instance is busy
    assert step.wake_at == T0 + 0.05
    assert q.step(T0 + 0.049, False).expired == []
    step = q.step(T0 + 0.07, False)  # stepped late: the message names the limit, not the lateness
    assert [i for i, _ in step.expired] == [a]
    err = step.expired[0][1]
    assert isinstance(err, Unavailable)
    assert "model 'm'" in err.message and "timed out" in err.message and "50000 us" in err.message
    assert len(q) == 0 and step.wake_at is None


def test_delay_timeout_moves_the_request_behind_undelayed_ones_of_its_level():
    qp = QueuePolicy(timeout_action=DELAY, default_timeout_us=50_000)
    q = BatchQueue(policy(max_batch_size=1, default_queue_policy=qp))
    admit(q, T0, req("a"))
    step = q.step(T0 + 0.05, False)
    assert step.expired == [] and len(q) == 1  # delayed, not rejected
    admit(q, T0 + 0.06, req("b"), req("c"))
    assert drain(q, T0 + 0.07) == [["b"], ["c"], ["a"]]


def test_delayed_requests_keep_their_order_and_do_not_jump_other_levels():
    qp = QueuePolicy(timeout_action=DELAY, default_timeout_us=10_000)
    q = BatchQueue(policy(max_batch_size=1, priority_levels=2, priority_queue_policy=((1, qp),)))
    admit(q, T0, req("h-old1", priority=1), req("h-old2", priority=1), req("low", priority=2))
    q.step(T0 + 0.02, False)  # both level-1 requests are delayed; level 2 has no timeout
    admit(q, T0 + 0.03, req("h-new", priority=1))
    # A delayed level-1 request is still level 1: ahead of level 2, behind fresh level 1.
    assert drain(q, T0 + 0.03) == [["h-new"], ["h-old1"], ["h-old2"], ["low"]]


def test_timeout_override_may_shorten_the_policy_timeout():
    qp = QueuePolicy(default_timeout_us=100_000, allow_timeout_override=True)
    q = BatchQueue(policy(default_queue_policy=qp))
    (a,) = admit(q, T0, req("a", timeout_us=20_000))
    assert a.timeout_at == T0 + 0.02
    step = q.step(T0 + 0.02, False)
    assert [i for i, _ in step.expired] == [a] and "20000 us" in step.expired[0][1].message


def test_timeout_override_never_lengthens_the_policy_timeout():
    qp = QueuePolicy(default_timeout_us=100_000, allow_timeout_override=True)
    q = BatchQueue(policy(default_queue_policy=qp))
    (a,) = admit(q, T0, req("a", timeout_us=5_000_000))
    assert a.timeout_at == T0 + 0.1
    assert [i for i, _ in q.step(T0 + 0.1, False).expired] == [a]


def test_without_allow_timeout_override_the_request_timeout_is_ignored():
    qp = QueuePolicy(default_timeout_us=100_000, allow_timeout_override=False)
    q = BatchQueue(policy(default_queue_policy=qp))
    (a,) = admit(q, T0, req("a", timeout_us=1_000))
    assert a.timeout_at == T0 + 0.1
    assert q.step(T0 + 0.05, False).expired == []


def test_a_request_timeout_applies_when_the_policy_has_none():
    q = BatchQueue(policy())
    (a,) = admit(q, T0, req("a", timeout_us=30_000))
    step = q.step(T0, False)
    assert step.wake_at == T0 + 0.03
    assert [i for i, _ in q.step(T0 + 0.03, False).expired] == [a]


def test_per_level_queue_policy_applies_only_to_its_level():
    reject = QueuePolicy(timeout_action=REJECT, default_timeout_us=10_000)
    q = BatchQueue(policy(priority_levels=2, priority_queue_policy=((2, reject),)))
    hi, lo = admit(q, T0, req("hi", priority=1), req("lo", priority=2))
    step = q.step(T0 + 1.0, False)
    assert [i for i, _ in step.expired] == [lo] and "priority level 2" in step.expired[0][1].message
    assert len(q) == 1 and q.depth(1) == 1


def test_max_queue_size_rejects_at_admission_naming_the_limit():
    qp = QueuePolicy(max_queue_size=2)
    q = BatchQueue(policy(max_batch_size=1, priority_levels=2, priority_queue_policy=((2, qp),)), model="m")
    admit(q, T0, req("a", priority=2), req("b", priority=2))
    with pytest.raises(Unavailable) as info:
        q.admit(req("c", priority=2), T0)
    msg = info.value.message
    assert "model 'm'" in msg and "maximum queue size" in msg and "2 requests" in msg and "priority level 2" in msg
    assert len(q) == 2
    admit(q, T0, req("x", priority=1))  # another level has its own (unbounded) queue
    assert drain(q, T0) == [["x"], ["a"], ["b"]]
    admit(q, T0, req("c", priority=2))  # room again once the queue moved
    assert len(q) == 1


def test_max_queue_size_counts_delayed_requests():
    qp = QueuePolicy(timeout_action=DELAY, default_timeout_us=1_000, max_queue_size=1)
    q = BatchQueue(policy(default_queue_policy=qp))
    admit(q, T0, req("a"))
    q.step(T0 + 1, False)  # "a" is delayed, still queued
    with pytest.raises(Unavailable, match="maximum queue size"):
        q.admit(req("b"), T0 + 1)


# -- deadlines and cancellation ---------------------------------------------------


def test_client_deadline_gives_deadline_exceeded():
    q = BatchQueue(policy(max_queue_delay_us=1_000_000), model="m")
    (a,) = admit(q, T0, req("a", deadline=T0 + 0.05))
    step = q.step(T0, True)
    assert step.batch == [] and step.wake_at == T0 + 0.05  # earlier than the queue delay
    step = q.step(T0 + 0.05, True)
    assert step.batch == [] and [i for i, _ in step.expired] == [a]
    assert isinstance(step.expired[0][1], DeadlineExceeded) and "model 'm'" in step.expired[0][1].message


def test_deadline_expires_even_when_no_instance_is_free():
    q = BatchQueue(policy())
    a, b = admit(q, T0, req("a", deadline=T0 + 0.05), req("b"))
    step = q.step(T0, False)
    assert step.wake_at == T0 + 0.05
    step = q.step(T0 + 0.06, False)
    assert [i for i, _ in step.expired] == [a] and isinstance(step.expired[0][1], DeadlineExceeded)
    assert names(q.step(T0 + 0.06, True).batch) == ["b"]


def test_deadline_wins_over_a_later_queue_timeout_and_over_delay():
    qp = QueuePolicy(timeout_action=DELAY, default_timeout_us=10_000)
    q = BatchQueue(policy(default_queue_policy=qp))
    (a,) = admit(q, T0, req("a", deadline=T0 + 0.05))
    assert q.step(T0 + 0.02, False).expired == []  # delayed by its queue timeout
    step = q.step(T0 + 0.05, False)  # and still answered at its deadline
    assert [i for i, _ in step.expired] == [a] and isinstance(step.expired[0][1], DeadlineExceeded)


def _exact(seconds: float) -> ExecutionModel:
    """An instance's estimate: every execution took ``seconds``, whatever its rows."""
    model = ExecutionModel()
    for _ in range(50):
        model.observe(1, seconds)
    return model


def test_a_deadline_out_of_reach_behind_the_queue_is_refused_at_admission_not_queued():
    q = BatchQueue(policy(max_batch_size=1, batching=False), model="m")
    busy = [Instance(T0 + 0.1, _exact(0.1))]  # executing for 100 ms more, 100 ms an execution
    admit(q, T0, req("a"), req("b"))  # two ahead: the next one is answered ~400 ms from now
    q.admit(req("c", deadline=T0 + 0.5), T0, busy)
    with pytest.raises(Unavailable, match="its deadline cannot be met: estimated 500000 us to answer it, 300000 us"):
        q.admit(req("d", deadline=T0 + 0.3), T0, busy)
    with pytest.raises(DeadlineExceeded, match="deadline passed 1000 us before it reached the model's queue"):
        q.admit(req("e", deadline=T0 - 0.001), T0)
    assert len(q) == 3 and drain(q, T0) == [["a"], ["b"], ["c"]]  # d and e were never queued


def test_a_rejecting_queue_timeout_out_of_reach_is_refused_and_a_delaying_one_is_not():
    reject = QueuePolicy(timeout_action=REJECT, default_timeout_us=150_000)
    q = BatchQueue(policy(max_batch_size=1, batching=False, default_queue_policy=reject), model="m")
    busy = [Instance(T0 + 0.1, _exact(0.1))]
    admit(q, T0, req("a"))  # an instance takes the next one after 200 ms: past 150 ms
    with pytest.raises(Unavailable, match="cannot start within its queue timeout: estimated 200000 us"):
        q.admit(req("b"), T0, busy)
    delay = QueuePolicy(timeout_action=DELAY, default_timeout_us=150_000)
    q = BatchQueue(policy(max_batch_size=1, batching=False, default_queue_policy=delay), model="m")
    admit(q, T0, req("a"))
    q.admit(req("b"), T0, busy)  # DELAY: its timeout only moves it back; it is served
    assert len(q) == 2


def test_cancel_drops_a_request_before_dispatch():
    q = BatchQueue(policy(max_queue_delay_us=100_000))
    a, b, c = admit(q, T0, req("a"), req("b"), req("c"))
    assert q.cancel(b) is True
    assert q.cancel(b) is False  # already gone
    assert len(q) == 2
    step = q.step(T0 + 0.1, True)
    assert names(step.batch) == ["a", "c"]
    assert q.cancel(a) is False  # dispatched: too late to cancel


def test_cancelling_the_head_moves_the_wait_to_the_next_head():
    q = BatchQueue(policy(max_queue_delay_us=100_000))
    a = admit(q, T0, req("a"))
    admit(q, T0 + 0.03, req("b"))
    q.cancel(a[0])
    step = q.step(T0 + 0.1, True)
    assert step.batch == [] and step.wake_at == T0 + 0.13


def test_a_cancelled_requests_timers_do_not_wake_the_driver():
    q = BatchQueue(policy())
    (a,) = admit(q, T0, req("a", timeout_us=50_000, deadline=T0 + 1))
    assert q.step(T0, False).wake_at == T0 + 0.05
    q.cancel(a)
    assert q.step(T0, False).wake_at is None
    (b,) = admit(q, T0, req("b", deadline=T0 + 1))
    step = q.step(T0, True)
    assert names(step.batch) == ["b"]
    assert step.wake_at is None  # dispatched: its deadline is no longer the queue's business


def test_cancel_a_delayed_request():
    qp = QueuePolicy(timeout_action=DELAY, default_timeout_us=1_000)
    q = BatchQueue(policy(default_queue_policy=qp))
    (a,) = admit(q, T0, req("a"))
    q.step(T0 + 1, False)
    assert q.cancel(a) is True and len(q) == 0
    assert q.step(T0 + 1, True).batch == []


def test_dead_timers_do_not_pile_up():
    q = BatchQueue(policy(max_batch_size=1))
    for i in range(1000):
        admit(q, T0, req(f"r{i}", deadline=T0 + 60, timeout_us=30_000_000))
        assert q.step(T0, True).batch
    assert len(q) == 0 and len(q._timers) == 0


def test_dead_timers_under_a_live_one_are_dropped_too():
    # A waiting low-priority request's earlier deadline stays on top of the timer
    # heap, so the dispatched requests' timers below it cannot just be popped.
    q = BatchQueue(policy(max_batch_size=1, priority_levels=2))
    admit(q, T0, req("keeper", priority=2, deadline=T0 + 30))
    for i in range(1000):
        admit(q, T0, req(f"r{i}", priority=1, deadline=T0 + 60, timeout_us=50_000_000))
        assert names(q.step(T0, True).batch) == [f"r{i}"]
    assert len(q) == 1 and len(q._timers) <= 65
    assert q.step(T0 + 30, False).expired[0][0].payload == "keeper"


# -- splitting -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows,max_rows,expected",
    [
        (10, 4, [(0, 4), (4, 8), (8, 10)]),
        (8, 4, [(0, 4), (4, 8)]),
        (3, 8, [(0, 3)]),
        (1, 1, [(0, 1)]),
    ],
)
def test_split_rows(rows, max_rows, expected):
    assert split_rows(rows, max_rows) == expected


def test_split_rows_refuses_a_zero_limit():
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        split_rows(4, 0)


# -- policy validation (policy.py) ------------------------------------------------------


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m"\n' + text, mc.ModelConfig())


def batching_policy(config: mc.ModelConfig) -> BatchingPolicy:
    """The policy a model with this config gets (its dynamic_batching checked by config/)."""
    return policy_module.batching_policy(model_spec(config))


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        batching_policy(config(text))
    return info.value.message


def test_policy_from_config():
    p = batching_policy(config("""
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [ 8, 4 ]
          max_queue_delay_microseconds: 500
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 7 max_queue_size: 5 }
          priority_queue_policy { key: 1 value { allow_timeout_override: true default_timeout_microseconds: 9 } }
        }
        parameters { key: "inferd.priority_aging_microseconds" value { string_value: "250" } }
        parameters { key: "inferd.split_large_requests" value { string_value: "true" } }
    """))
    assert p.batching and p.max_batch_size == 16 and p.preferred_batch_sizes == (4, 8)
    assert p.max_queue_delay_us == 500 and not p.preserve_ordering
    assert p.priority_levels == 3 and p.default_priority_level == 2
    assert p.queue_policy(2) == QueuePolicy(DELAY, 7, False, 5)
    assert p.queue_policy(1) == QueuePolicy(REJECT, 9, True, 0)
    assert p.aging_us == 250 and p.split_large_requests


def test_preserve_ordering_from_config():
    """With one priority level and no DELAY policy (Triton refuses the others: tests/test_config_validation.py)."""
    p = batching_policy(config("max_batch_size: 4\ndynamic_batching { preserve_ordering: true }"))
    assert p.preserve_ordering and p.priority_levels == 1


def test_no_dynamic_batching_is_the_plain_scheduler():
    p = batching_policy(config("max_batch_size: 8"))
    assert not p.batching and p.max_rows == 8 and p.priority_levels == 1


def test_default_priority_level_out_of_range_is_refused():
    msg = refused("max_batch_size: 8\ndynamic_batching { priority_levels: 3 default_priority_level: 4 }")
    assert "model 'm'" in msg and "dynamic_batching.default_priority_level" in msg and "4" in msg and "(3)" in msg


def test_default_priority_level_without_levels_is_refused():
    msg = refused("max_batch_size: 8\ndynamic_batching { default_priority_level: 2 }")
    assert "default_priority_level 2" in msg and "priority_levels" in msg


def test_priority_queue_policy_key_beyond_priority_levels_is_refused():
    msg = refused("""max_batch_size: 8
        dynamic_batching { priority_levels: 2 default_priority_level: 1
          priority_queue_policy { key: 3 value { max_queue_size: 1 } } }""")
    assert "dynamic_batching.priority_queue_policy key 3" in msg and "1..priority_levels (2)" in msg


def test_priority_queue_policy_without_levels_is_refused():
    msg = refused("""max_batch_size: 8
        dynamic_batching { priority_queue_policy { key: 1 value { max_queue_size: 1 } } }""")
    assert "priority_queue_policy has levels [1]" in msg and "priority_levels is 0" in msg


def test_preferred_size_above_max_batch_size_is_refused():
    msg = refused("max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4, 16 ] }")
    assert "dynamic_batching.preferred_batch_size 16" in msg and "max_batch_size (8)" in msg


def test_preferred_size_listed_twice_is_refused():
    msg = refused("max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4, 4 ] }")
    assert "preferred_batch_size lists a size twice" in msg and "[4, 4]" in msg


def test_dynamic_batching_with_max_batch_size_zero_is_refused():
    msg = refused("max_batch_size: 0\ndynamic_batching { }")
    assert "model 'm': dynamic_batching needs max_batch_size >= 1, got 0" in msg


# -- the time a request's frontend received it ---------------------------------------


def test_a_queue_timeout_counts_from_when_the_frontend_received_the_request():
    qp = QueuePolicy(timeout_action=REJECT, default_timeout_us=50_000)
    q = BatchQueue(policy(default_queue_policy=qp), model="m")
    (a,) = admit(q, T0 + 0.03, req("a", received=T0))  # it waited 30 ms before the queue saw it
    assert q.step(T0 + 0.03, False).wake_at == pytest.approx(T0 + 0.05)
    step = q.step(T0 + 0.05, False)
    assert [i for i, _ in step.expired] == [a] and "50000 us" in step.expired[0][1].message


def test_a_request_received_before_its_queue_saw_it_waits_only_what_is_left_of_the_delay():
    q = BatchQueue(policy(max_batch_size=4, max_queue_delay_us=10_000), model="m")  # fixed: waits out the delay
    admit(q, T0, req("late", received=T0 - 0.012))  # received 12 ms ago: past the 10 ms delay already
    step = q.step(T0, True)
    assert names(step.batch) == ["late"]


def test_a_received_time_from_another_clock_never_starts_a_wait_in_the_future():
    q = BatchQueue(policy(), model="m")
    (a,) = admit(q, T0, req("a", received=T0 + 5.0))
    assert a.arrival == T0


def test_a_request_the_server_sheds_is_answered_unavailable_when_its_bound_passes_in_the_queue():
    q = BatchQueue(policy(), model="m")
    (a, b) = admit(q, T0 + 0.005, req("a", received=T0, shed_at=T0 + 0.02), req("b"))
    step = q.step(T0 + 0.005, False)  # the instance is busy
    assert step.wake_at == pytest.approx(T0 + 0.02)
    assert q.step(T0 + 0.019, False).expired == []
    step = q.step(T0 + 0.021, False)
    assert [i for i, _ in step.expired] == [a] and len(q) == 1
    err = step.expired[0][1]
    assert isinstance(err, Unavailable)
    m = err.message
    assert "model 'm'" in m and "shed" in m and "waited 21000 us" in m and "target of 20000 us" in m
    assert "--queue-delay-target-us" in m and "--no-shed" in m
    assert names(q.step(T0 + 0.021, True).batch) == ["b"]  # no bound: it waits on
