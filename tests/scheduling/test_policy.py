"""inferd.scheduling.policy: the batching policy's derived values."""

from __future__ import annotations

from inferd.config._sequence import SequencePolicy
from inferd.scheduling.policy import BatchingPolicy


def test_the_queue_delay_is_converted_to_seconds_in_one_place_per_policy():
    """The schedulers read ``max_queue_delay_s``, never the microseconds, so the unit changes once."""
    batching = BatchingPolicy(max_batch_size=8, batching=True, max_queue_delay_us=1500)
    assert batching.max_queue_delay_s == 0.0015
    assert batching.wait.bound_s == batching.max_queue_delay_s
    sequence = SequencePolicy(strategy="oldest", max_batch_size=4, idle_us=0, max_queue_delay_us=250)
    assert sequence.max_queue_delay_s == 0.00025
    assert BatchingPolicy().max_queue_delay_s == SequencePolicy("direct", 1, 0).max_queue_delay_s == 0.0
