"""The one interface every scheduler implements: plain models and ensembles."""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, Sequence

import numpy as np

from inferd.types import InferenceRequest

if TYPE_CHECKING:
    from inferd.observability.stats import ModelStats
    from inferd.scheduling.instances import InstanceWorker


class Scheduler(abc.ABC):
    @abc.abstractmethod
    async def infer(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        """Run ``request`` (inputs validated, in the model's shapes) and return
        its outputs. ``rows`` is the request's batch size (1 without batching).

        Raises the domain error the client should see. Cancelling the awaiting
        task drops the request if it has not started executing.
        """

    @abc.abstractmethod
    def inflight(self) -> int:
        """Requests accepted and not yet answered."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Finish every accepted request, then release the instances."""

    def problem(self) -> str | None:
        """Why the model cannot execute now (every instance failed), or None."""
        return None


def workers_problem(workers: Sequence["InstanceWorker"]) -> str | None:
    """The first instance's reason when every one of ``workers`` has failed (InstanceWorker.failed)."""
    reasons = [w.failed for w in workers]
    return reasons[0] if reasons and all(reasons) else None


class Inflight:
    """The requests a scheduler accepted and has not answered, and a way to
    wait until there are none (``stop`` drains before releasing instances).

    ``pending`` counts in the model's ``ModelStats.pending`` too (the queue
    depth metric); a split request's parent is in flight but not pending.
    """

    __slots__ = ("count", "_stats", "_idle")

    def __init__(self, stats: "ModelStats") -> None:
        self.count = 0
        self._stats = stats
        self._idle: asyncio.Event | None = None

    def enter(self, pending: bool = True) -> None:
        self.count += 1
        if pending:
            self._stats.pending += 1

    def leave(self, pending: bool = True) -> None:
        self.count -= 1
        if pending:
            self._stats.pending -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def drained(self) -> None:
        if self.count:
            self._idle = asyncio.Event()
            await self._idle.wait()
