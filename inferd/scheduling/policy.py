"""Batching and queue policies: plain data for the batch decision.

Built once at load from the model's checked ``dynamic_batching`` block
(:class:`inferd.config.DynamicBatching`, where every invalid combination was
refused) and its inferd parameters (aging, splitting).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.config import DELAY, REJECT, DynamicBatching, QueuePolicy, VarlenSpec
from inferd.scheduling.adaptive import ADAPTIVE, FIXED, WaitPolicy
from inferd.scheduling.formation import Grouping

__all__ = ["DELAY", "REJECT", "BatchingPolicy", "QueuePolicy", "batching_policy"]


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """How one model's requests are queued and grouped into executions.

    ``batching=False`` is the plain scheduler of a model without
    ``dynamic_batching``: one request per execution, in arrival order.
    """

    max_batch_size: int = 0
    batching: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 1  # levels are 1..priority_levels, 1 the highest
    default_priority_level: int = 1
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()
    aging_us: int = 0
    split_large_requests: bool = False
    grouping: Grouping = Grouping()  # which requests may share a batch (shapes, padding, buckets, budget)
    # How long a batch waits within max_queue_delay_us (built directly: Triton's "fixed"; from a
    # config: inferd.batch_wait), and the latency SLO (inferd.max_latency_microseconds, 0: none).
    batch_wait: str = FIXED
    slo_us: int = 0

    @property
    def wait(self) -> WaitPolicy:
        return WaitPolicy(self.batch_wait, self.max_queue_delay_us / 1e6, self.slo_us / 1e6)

    def queue_policy(self, level: int) -> QueuePolicy:
        for lvl, policy in self.priority_queue_policy:
            if lvl == level:
                return policy
        return self.default_queue_policy

    @property
    def max_rows(self) -> int:
        """Rows one execution may carry (1 request when the model does not batch)."""
        return max(self.max_batch_size, 1)


def batching_policy(max_batch_size: int, dynamic: DynamicBatching | None, *, aging_us: int = 0,
                    split: bool = False, varlen: VarlenSpec | None = None, batch_wait: str = ADAPTIVE,
                    slo_us: int = 0) -> BatchingPolicy:
    """The policy of a model with ``max_batch_size`` and the checked ``dynamic_batching``
    block ``dynamic`` (None: the plain scheduler); ``varlen``: its variable-length batching;
    ``batch_wait`` and ``slo_us``: inferd.batch_wait and inferd.max_latency_microseconds."""
    grouping = Grouping.of(varlen)
    if dynamic is None:
        return BatchingPolicy(max_batch_size=max_batch_size, aging_us=aging_us, split_large_requests=split,
                              grouping=grouping, batch_wait=batch_wait, slo_us=slo_us)
    return BatchingPolicy(
        max_batch_size=max_batch_size,
        batching=True,
        preferred_batch_sizes=dynamic.preferred_batch_sizes,
        max_queue_delay_us=dynamic.max_queue_delay_us,
        preserve_ordering=dynamic.preserve_ordering,
        priority_levels=dynamic.priority_levels,
        default_priority_level=dynamic.default_priority_level,
        default_queue_policy=dynamic.default_queue_policy,
        priority_queue_policy=dynamic.priority_queue_policy,
        aging_us=aging_us,
        split_large_requests=split,
        grouping=grouping,
        batch_wait=batch_wait,
        slo_us=slo_us,
    )
