"""Batch formation: which queued requests may share a batch, and how large it may grow.

Plain data and pure functions, read by the batch decision (:mod:`inferd.scheduling.queue`)
and by the driver when it queues a request:

- :class:`Grouping` turns a request's inputs into its *group key* (only requests
  with equal keys share a batch) and its *length*. Without variable-length
  batching the key is every input's shape, as Triton's dynamic batcher requires.
  With padding the padded inputs leave the key (their lengths may differ) and the
  length bucket enters it; Triton's ragged inputs never count.
- :class:`OpenBatch` is one batch being formed: offered requests in service order,
  it answers whether each joins, belongs to another group, would overflow
  ``max_batch_size`` (later requests wait, in order), or would overflow the element
  budget (rows x longest length; a shorter, later request may still join).

A long request is never starved by short ones: the decision always starts a batch
with the request first in service order, so the budget can pass over a request
only in favour of requests that are served after it once it is first.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable

import numpy as np

from inferd.errors import InvalidArgument

if TYPE_CHECKING:
    from inferd.config import VarlenSpec
    from inferd.scheduling.queue import Pending

JOINED, OTHER_GROUP, FULL, OVER_BUDGET = range(4)


@dataclass(frozen=True, slots=True)
class Grouping:
    """How a request's inputs decide the batch it may join (built once, at load)."""

    padded: tuple[tuple[str, tuple[int, ...]], ...] = ()  # input -> its variable dims (model dims, no batch)
    ragged: frozenset[str] = frozenset()
    filled: frozenset[str] = frozenset()  # mask / lengths inputs: a request may send its own
    reference: str | None = None  # the padded input whose extents make a request's length
    buckets: tuple[int, ...] = ()
    max_elements: int = 0  # rows x longest length per batch; 0: no budget

    @classmethod
    def of(cls, varlen: "VarlenSpec | None") -> "Grouping":
        if varlen is None:
            return cls()
        return cls(
            padded=tuple((p.name, p.variable) for p in varlen.padded),
            ragged=varlen.ragged,
            filled=frozenset(f.name for f in varlen.filled),
            reference=varlen.reference,
            buckets=varlen.buckets,
            max_elements=varlen.max_batch_elements,
        )

    @property
    def plain(self) -> bool:
        """Equal shapes only (no padding, no ragged inputs): the key is every input's shape."""
        return not self.padded and not self.ragged

    def describe(self, model: str, inputs: dict[str, np.ndarray], rows: int) -> tuple[Hashable, int]:
        """The request's group key and length; InvalidArgument when no batch could ever hold it."""
        if not self.padded and not self.ragged:  # plain, without the property's call: once per request
            return tuple([(name, a.shape[1:]) for name, a in inputs.items()]), 0
        padded = dict(self.padded)
        # Padded, ragged, mask and lengths inputs count by name only: a batch's requests send the same
        # inputs (an optional one on all or none of them), of any lengths.
        free = self.ragged | self.filled
        key: list[Hashable] = [(name, None if name in padded or name in free else a.shape[1:])
                               for name, a in inputs.items()]
        length = 0
        if self.reference is not None:
            shape = inputs[self.reference].shape
            length = int(np.prod([shape[1 + d] for d in padded[self.reference]]))
            if self.buckets:
                bucket = bisect_left(self.buckets, length)
                if bucket == len(self.buckets):
                    raise InvalidArgument(
                        f"model '{model}': input '{self.reference}' has length {length}, longer than the last of "
                        f"inferd.length_buckets ({self.buckets[-1]})")
                key.append(("bucket", bucket))
            if self.max_elements and rows * length > self.max_elements:
                raise InvalidArgument(
                    f"model '{model}': the request's {rows} row(s) of length {length} ({rows * length} elements) "
                    f"exceed inferd.max_batch_elements ({self.max_elements}), the most one batch may hold")
        return tuple(key), length


class OpenBatch:
    """A batch being formed around ``head``; see :meth:`offer`."""

    __slots__ = ("key", "rows", "longest", "max_rows", "max_elements")

    def __init__(self, head: "Pending", max_rows: int, max_elements: int = 0) -> None:
        self.key = head.shape_key
        self.rows = head.rows
        self.longest = head.length
        self.max_rows = max_rows
        self.max_elements = max_elements

    def offer(self, item: "Pending") -> int:
        """JOINED (and counted in), OTHER_GROUP, FULL (rows) or OVER_BUDGET (elements)."""
        if item.shape_key != self.key:
            return OTHER_GROUP
        rows = self.rows + item.rows
        if rows > self.max_rows:
            return FULL
        longest = max(self.longest, item.length)
        if self.max_elements and rows * longest > self.max_elements:
            return OVER_BUDGET
        self.rows, self.longest = rows, longest
        return JOINED

    @property
    def full(self) -> bool:
        """No further request could join: the rows are used up, or one more row of the
        current longest length would pass the budget."""
        if self.rows >= self.max_rows:
            return True
        return bool(self.max_elements) and (self.rows + 1) * self.longest > self.max_elements
