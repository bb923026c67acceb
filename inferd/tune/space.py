"""The configurations ``inferd tune`` tries for one model: :class:`Candidate` and :func:`space`.

A candidate is the handful of fields that decide how requests are batched and run: whether the
model batches at all (Triton's default is not to: no ``dynamic_batching`` block), its
``max_batch_size``, ``preferred_batch_size``, ``max_queue_delay_microseconds`` and how the wait is
spent (``inferd.batch_wait``: adaptive or fixed), the instance count and kind, the
``inferd.max_batch_elements`` budget of a variable-length model, and (own server only) the number
of frontend worker processes. Everything else in the model's config is kept as it is.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from inferd._proto import model_config_pb2 as mc

DELAYS_US = (0, 100, 500, 2000)
MAX_INSTANCES = 4


@dataclass(frozen=True)
class Candidate:
    batching: bool = True  # False: no dynamic_batching block (each request runs alone, as Triton's default)
    max_batch_size: int = 0
    delay_us: int = 0
    batch_wait: str = "adaptive"  # "adaptive" | "fixed" (inferd.batch_wait; meaningless without a delay)
    preferred: tuple[int, ...] = ()
    instances: int = 1
    kind: str = "KIND_CPU"
    max_batch_elements: int = 0  # variable-length models only (0: no budget)
    frontend_workers: int | None = None  # None: the server's own choice (and all a running server can do)

    def label(self) -> str:
        if not self.batching:
            parts = ["no batching"]
        else:
            parts = [f"mbs {self.max_batch_size}", f"delay {self.delay_us}us"]
            if self.delay_us:
                parts.append(self.batch_wait)
            if self.preferred:
                parts.append("pref " + ",".join(map(str, self.preferred)))
            if self.max_batch_elements:
                parts.append(f"elements {self.max_batch_elements}")
        parts.append(f"{self.instances}x{self.kind.removeprefix('KIND_')}")
        if self.frontend_workers is not None:
            parts.append(f"workers {self.frontend_workers}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["preferred"] = list(self.preferred)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Candidate":
        return cls(**{**d, "preferred": tuple(d.get("preferred", ()))})

    def apply(self, base: mc.ModelConfig) -> mc.ModelConfig:
        """``base`` with this candidate's fields: the config to load (and to write with --write)."""
        config = mc.ModelConfig()
        config.CopyFrom(base)
        if base.max_batch_size > 0 or self.max_batch_size > 0:
            config.max_batch_size = self.max_batch_size if self.batching else base.max_batch_size
        if self.batching:
            config.dynamic_batching.max_queue_delay_microseconds = self.delay_us
            del config.dynamic_batching.preferred_batch_size[:]
            config.dynamic_batching.preferred_batch_size.extend(self.preferred)
        else:
            config.ClearField("dynamic_batching")
        del config.instance_group[:]
        group = config.instance_group.add()
        group.count = self.instances
        group.kind = mc.ModelInstanceGroup.Kind.Value(self.kind)
        _set_parameter(config, "inferd.batch_wait", self.batch_wait if self.batching and self.delay_us else None)
        _set_parameter(config, "inferd.max_batch_elements",
                       str(self.max_batch_elements) if self.max_batch_elements else None)
        return config


def _set_parameter(config: mc.ModelConfig, key: str, value: str | None) -> None:
    if value is None:
        if key in config.parameters:
            del config.parameters[key]
    else:
        config.parameters[key].string_value = value


def current(base: mc.ModelConfig) -> Candidate:
    """The candidate the repository's config is now (the first instance group's count and kind)."""
    group = base.instance_group[0] if base.instance_group else None
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind) if group else "KIND_CPU"
    if kind == "KIND_AUTO":
        kind = "KIND_CPU"
    params = {k: v.string_value for k, v in base.parameters.items()}
    batching = base.HasField("dynamic_batching")
    db = base.dynamic_batching
    return Candidate(
        batching=batching, max_batch_size=base.max_batch_size if batching else 0,
        delay_us=db.max_queue_delay_microseconds if batching else 0,
        batch_wait=params.get("inferd.batch_wait", "adaptive"), preferred=tuple(db.preferred_batch_size),
        instances=group.count if group and group.count else 1, kind=kind,
        max_batch_elements=int(params.get("inferd.max_batch_elements", "0") or 0))


@dataclass(frozen=True)
class SpaceLimits:
    cores: int = 2
    gpus: int = 0
    frontend_workers: tuple[int | None, ...] = (None,)
    varlen: bool = False  # the model pads variable-length requests (inferd.padding)
    max_instances: int = MAX_INSTANCES
    delays_us: tuple[int, ...] = DELAYS_US
    extra: dict[str, Any] = field(default_factory=dict)


def batch_sizes(model_max: int) -> list[int]:
    """Powers of two from 4 up to what the model allows, and its own maximum."""
    sizes = {s for s in (4, 8, 16, 32, 64, 128, 256, 512, 1024) if s <= model_max}
    sizes.add(model_max)
    return sorted(sizes)


def space(base: mc.ModelConfig, limits: SpaceLimits) -> list[Candidate]:
    """Every candidate the model allows: batch sizes up to its max_batch_size (a model that cannot
    batch, max_batch_size 0, varies only its instances), waits, instance counts up to the cores
    (and GPU instances where there are GPUs), plus Triton's default (no batching) as a reference,
    except for a padded model (``limits.varlen``), whose padding works on the batcher's batches."""
    kinds = ["KIND_CPU"] + (["KIND_GPU"] if limits.gpus else [])
    instances = [n for n in range(1, limits.max_instances + 1) if n <= max(1, limits.cores)]
    out: list[Candidate] = []
    for workers, kind, count in itertools.product(limits.frontend_workers, kinds, instances):
        if not limits.varlen:  # padding and length buckets shape dynamic batches: they need the batcher
            out.append(Candidate(batching=False, instances=count, kind=kind, frontend_workers=workers))
        if base.max_batch_size <= 0:
            continue
        for size, delay in itertools.product(batch_sizes(base.max_batch_size), limits.delays_us):
            waits = ("adaptive", "fixed") if delay else ("adaptive",)
            prefs: list[tuple[int, ...]] = [(), (size,)] if size > 4 else [()]
            elements = [0] + ([size * 64, size * 256] if limits.varlen else [])
            for wait, pref, budget in itertools.product(waits, prefs, elements):
                out.append(Candidate(True, size, delay, wait, pref, count, kind, budget, workers))
    return list(dict.fromkeys(out))


def with_workers(candidate: Candidate, workers: int | None) -> Candidate:
    return replace(candidate, frontend_workers=workers)


def distance(a: Candidate, b: Candidate) -> int:
    """How many of the fields that matter differ between ``a`` and ``b``. The wait's kind counts
    as what it does: without a delay there is no wait, which is what "adaptive" does too, so a
    fixed 500 us wait is two steps from no delay and an adaptive one is one. Without batching
    there are no batch fields to differ in."""
    if a.batching != b.batching:
        fields = 1
    elif a.batching:
        fields = sum((a.max_batch_size != b.max_batch_size, a.delay_us != b.delay_us, a.preferred != b.preferred,
                      a.max_batch_elements != b.max_batch_elements, _wait(a) != _wait(b)))
    else:
        fields = 0
    return fields + sum((a.instances != b.instances, a.kind != b.kind, a.frontend_workers != b.frontend_workers))


def _wait(c: Candidate) -> str:
    return c.batch_wait if c.batching and c.delay_us else "adaptive"


def as_seen_at(candidate: Candidate, concurrency: int) -> Candidate:
    """What a closed loop of ``concurrency`` clients can tell of ``candidate``: never more than
    that many requests are queued, so a preferred size above it is never reached (it behaves as
    if absent), and every ``max_batch_size`` above it behaves the same (the batch is never full:
    it runs when the wait ends). Those are mapped to ``concurrency + 1``; a size of exactly
    ``concurrency`` is kept (that batch does fill, and runs without waiting)."""
    if not candidate.batching:
        return candidate
    mbs = candidate.max_batch_size if candidate.max_batch_size <= concurrency else concurrency + 1
    return replace(candidate, max_batch_size=mbs, preferred=tuple(p for p in candidate.preferred if p <= concurrency))


def distinct_at(candidates: list[Candidate], concurrency: int | None, current: Candidate) -> list[Candidate]:
    """``candidates`` less those that behave like another one (or like ``current``) at the
    concurrency (:func:`as_seen_at`; None: an open loop, where all differ). Of each group the one
    nearest ``current`` stays, so a choice among equals keeps the repository's values."""
    if concurrency is None:
        return [c for c in candidates if c != current]
    groups: dict[Candidate, Candidate] = {as_seen_at(current, concurrency): current}
    for c in candidates:
        key = as_seen_at(c, concurrency)
        kept = groups.get(key)
        if kept is None or (kept != current and distance(c, current) < distance(kept, current)):
            groups[key] = c
    return [c for c in groups.values() if c != current]
