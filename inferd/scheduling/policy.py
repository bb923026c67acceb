"""Batching and queue policies: plain data for the batch decision.

Built once at load, in one place (:func:`batching_policy`), from the model's
checked spec: its ``dynamic_batching`` block (:class:`inferd.config.DynamicBatching`,
where every invalid combination was refused), its variable-length batching and its
inferd parameters (aging, splitting, the batch wait, the latency SLO). A new knob is
a field of ``InferdParameters`` read here, and nowhere between.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.config import DELAY, REJECT, ModelSpec, QueuePolicy
from inferd.scheduling.adaptive import FIXED, WaitPolicy
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
    def max_queue_delay_s(self) -> float:
        """``max_queue_delay_microseconds`` in seconds, the unit the schedulers' clocks count in."""
        return self.max_queue_delay_us / 1e6

    @property
    def wait(self) -> WaitPolicy:
        return WaitPolicy(self.batch_wait, self.max_queue_delay_s, self.slo_us / 1e6)

    def queue_policy(self, level: int) -> QueuePolicy:
        for lvl, policy in self.priority_queue_policy:
            if lvl == level:
                return policy
        return self.default_queue_policy

    @property
    def max_rows(self) -> int:
        """Rows one execution may carry (1 request when the model does not batch)."""
        return max(self.max_batch_size, 1)


def batching_policy(spec: ModelSpec) -> BatchingPolicy:
    """The policy of the model ``spec`` describes: without ``dynamic_batching``, the plain scheduler."""
    params, dynamic = spec.params, spec.dynamic_batching
    common = dict(max_batch_size=spec.max_batch_size, aging_us=params.priority_aging_microseconds,
                  split_large_requests=params.split_large_requests, grouping=Grouping.of(spec.varlen),
                  batch_wait=params.batch_wait, slo_us=params.max_latency_microseconds)
    if dynamic is None:
        return BatchingPolicy(**common)  # type: ignore[arg-type]
    return BatchingPolicy(
        batching=True,
        preferred_batch_sizes=dynamic.preferred_batch_sizes,
        max_queue_delay_us=dynamic.max_queue_delay_us,
        preserve_ordering=dynamic.preserve_ordering,
        priority_levels=dynamic.priority_levels,
        default_priority_level=dynamic.default_priority_level,
        default_queue_policy=dynamic.default_queue_policy,
        priority_queue_policy=dynamic.priority_queue_policy,
        **common,  # type: ignore[arg-type]
    )
