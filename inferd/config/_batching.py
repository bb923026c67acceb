"""``dynamic_batching``: checked at load, turned into plain data for the scheduler.

:func:`dynamic_batching` refuses every invalid combination with the field and
value named; :mod:`inferd.scheduling.policy` builds its batch decision's
policy from the :class:`DynamicBatching` it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd._proto import model_config_pb2 as mc
from inferd.errors import ConfigError

REJECT = "REJECT"
DELAY = "DELAY"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    timeout_action: str = REJECT
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    """A checked ``dynamic_batching`` block; priority levels are 1..priority_levels, 1 the highest."""

    preferred_batch_sizes: tuple[int, ...] = ()  # ascending
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 1
    default_priority_level: int = 1
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()


def _queue_policy(p: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=mc.ModelQueuePolicy.TimeoutAction.Name(p.timeout_action),
        default_timeout_us=int(p.default_timeout_microseconds),
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


def check_dynamic_batching(config: mc.ModelConfig) -> None:
    """What Triton checks of ``dynamic_batching`` when it reads a config, before any auto-complete
    (which may still set max_batch_size): the priority levels, their queue policies, and
    preserve_ordering's rules."""
    if config.HasField("dynamic_batching"):
        _levels(config.dynamic_batching, f"model '{config.name}': dynamic_batching")


def _levels(db: mc.ModelDynamicBatching, where: str) -> tuple[int, int]:
    """(priority levels, default level), checked; 0 levels is one level."""
    levels = int(db.priority_levels)
    default_level = int(db.default_priority_level)
    if levels == 0:
        if default_level != 0:
            raise ConfigError(
                f"{where}.default_priority_level {default_level} needs priority_levels >= {default_level}, got 0"
            )
        if db.priority_queue_policy:
            keys = sorted(db.priority_queue_policy.keys())
            raise ConfigError(f"{where}.priority_queue_policy has levels {keys} but priority_levels is 0")
        levels, default_level = 1, 1
    elif not 1 <= default_level <= levels:
        raise ConfigError(
            f"{where}.default_priority_level must be in 1..priority_levels ({levels}), got {default_level}"
        )
    for key in sorted(db.priority_queue_policy.keys()):
        if not 1 <= key <= levels:
            raise ConfigError(
                f"{where}.priority_queue_policy key {key} is outside 1..priority_levels ({levels})"
            )
    if db.preserve_ordering:
        _check_preserve_ordering(db, where)
    return levels, default_level


def _check_preserve_ordering(db: mc.ModelDynamicBatching, where: str) -> None:
    """Triton's rule: responses in arrival order rule out priorities and delayed requests."""
    if db.priority_levels > 1:
        raise ConfigError(
            f"{where}.priority_levels is {db.priority_levels} with preserve_ordering true; responses sent in "
            "arrival order allow one priority level only: set priority_levels to 0 or 1, or preserve_ordering "
            "to false"
        )
    policies = [("default_queue_policy", db.default_queue_policy)] + [
        (f"priority_queue_policy[{key}]", db.priority_queue_policy[key]) for key in sorted(db.priority_queue_policy)]
    for field, policy in policies:
        if policy.timeout_action == mc.ModelQueuePolicy.DELAY and policy.default_timeout_microseconds:
            raise ConfigError(
                f"{where}.{field} has timeout_action DELAY (default_timeout_microseconds "
                f"{policy.default_timeout_microseconds}) with preserve_ordering true; a delayed request would "
                "hold back every response behind it: use timeout_action REJECT, or preserve_ordering false"
            )


def dynamic_batching(config: mc.ModelConfig) -> DynamicBatching | None:
    """The checked ``dynamic_batching`` block; None when the config has none."""
    if not config.HasField("dynamic_batching"):
        return None
    db = config.dynamic_batching
    where = f"model '{config.name}': dynamic_batching"
    if config.max_batch_size <= 0:
        raise ConfigError(
            f"{where} needs max_batch_size >= 1, got {config.max_batch_size} "
            "(a model that does not batch cannot be batched dynamically)"
        )
    preferred = tuple(int(p) for p in db.preferred_batch_size)
    for p in preferred:
        if p < 1 or p > config.max_batch_size:
            raise ConfigError(
                f"{where}.preferred_batch_size {p} must be in 1..max_batch_size ({config.max_batch_size})"
            )
    if len(set(preferred)) != len(preferred):
        raise ConfigError(f"{where}.preferred_batch_size lists a size twice: {list(preferred)}")
    levels, default_level = _levels(db, where)
    per_level = [(int(key), _queue_policy(db.priority_queue_policy[key])) for key in sorted(db.priority_queue_policy)]
    default_policy = _queue_policy(db.default_queue_policy) if db.HasField("default_queue_policy") else QueuePolicy()
    return DynamicBatching(
        preferred_batch_sizes=tuple(sorted(preferred)),
        max_queue_delay_us=int(db.max_queue_delay_microseconds),
        preserve_ordering=bool(db.preserve_ordering),
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=default_policy,
        priority_queue_policy=tuple(per_level),
    )
