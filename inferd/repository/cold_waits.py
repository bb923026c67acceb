"""What a request for a model that is not loaded waits for, and what it is told (on_demand).

Its wait for the load is bounded by its own deadline and queue timeout, counted
from its arrival (:func:`wait_bound`).

A failed demand load is remembered (:class:`Failure`): until its backoff passes
(1 s after the first failure, doubling with each failure in a row up to 60 s),
or the model's files change (:func:`~inferd.repository.layout.change_stamp`), or
a RepositoryModelLoad asks for it, a request for it is answered at once with
the failure (the same status, its reason, when it is tried again) instead of
loading it again: a client retrying a broken model in a loop costs a stat call
per request, not a load. Why those numbers: a failure that passes by itself (a
file being copied in, memory freed by another process) is retried within a
second or two; one that lasts costs one load a minute at most, and an operator
who fixes the files, or asks for a load, does not wait at all. The driver
(:mod:`inferd.repository.demand`) keeps them and checks the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from inferd.errors import DeadlineExceeded, InferdError, Unavailable
from inferd.types import InferenceRequest

BACKOFF_FIRST = 1.0  # seconds a model whose demand load failed is not tried again after its first failure
BACKOFF_MAX = 60.0  # ... doubling with each failure in a row up to this


def backoff(failures: int) -> float:
    """Seconds before a model that failed to load ``failures`` times in a row is tried again."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** max(0, failures - 1))


@dataclass(slots=True)
class Failure:
    """A model's last failed demand load, remembered until it may be tried again."""

    kind: type[InferdError]  # the type of what the load raised: the status every request then gets
    reason: str  # the load's own words (the error itself is not kept: its traceback holds the failed build)
    failures: int  # in a row
    at: float  # clock seconds of the failure
    retry_at: float
    stamp: tuple  # the model folder's change stamp when that load started

    @classmethod
    def after(cls, previous: "Failure | None", error: InferdError, stamp: tuple, now: float) -> "Failure":
        """The failure a load that raised ``error`` at ``now`` leaves (``previous``: the one before, which
        counts in a row when the files are the same)."""
        failures = previous.failures + 1 if previous is not None and previous.stamp == stamp else 1
        return cls(type(error), error.message, failures, now, now + backoff(failures), stamp)

    def answer(self, name: str, now: float) -> InferdError:
        """What a request for model ``name`` gets at ``now``, before the backoff has passed."""
        return self.kind(
            f"model '{name}' failed to load on demand {now - self.at:.1f} s ago: {self.reason}; it is not "
            f"loaded again for {self.retry_at - now:.1f} s (failure {self.failures} in a row: the wait "
            f"doubles from {BACKOFF_FIRST:g} s up to {BACKOFF_MAX:g} s), or as soon as its files change or "
            "RepositoryModelLoad asks for it")


def wait_bound(request: InferenceRequest, now: float) -> tuple[float, Callable[[str], InferdError]] | None:
    """How long the request may wait for its model's load (seconds) and the error to give it then:
    its deadline, or its queue timeout counted from when its frontend received it; None: unbounded."""
    bounds = []
    if request.deadline is not None:
        bounds.append((request.deadline - now, _deadline_passed))
    if request.timeout_us:
        received = request.received_ns * 1e-9 if request.received_ns else now
        bounds.append((received + request.timeout_us * 1e-6 - now, _timed_out))
    return min(bounds, key=lambda b: b[0]) if bounds else None


def _deadline_passed(name: str) -> InferdError:
    return DeadlineExceeded(f"model '{name}': the request's deadline passed while the model loaded on demand")


def _timed_out(name: str) -> InferdError:
    return Unavailable(f"model '{name}': request timed out while the model loaded on demand (its timeout "
                       "counts from its arrival, load time included); a longer timeout would wait for it")
