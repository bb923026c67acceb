"""The one interface every scheduler implements: plain models and ensembles."""

from __future__ import annotations

import abc

import numpy as np

from inferd.types import InferenceRequest


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
