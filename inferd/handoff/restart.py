"""When to start a frontend worker again after it died: a pure decision on plain times.

The first death is answered at once (clients of the other frontends never notice,
and this one's clients reconnect to a fresh worker or to the others). A worker that
keeps dying soon after it starts is restarted with a doubling delay, up to
``max_delay``, so a crash loop cannot eat the cores the models need; one that ran for
``stable_after`` seconds before dying starts the count afresh.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    first_backoff: float = 0.1  # the delay after a second quick death
    max_delay: float = 10.0
    stable_after: float = 30.0

    def __post_init__(self) -> None:
        if self.first_backoff <= 0 or self.max_delay < self.first_backoff or self.stable_after <= 0:
            raise ValueError(f"restart policy: need 0 < first_backoff <= max_delay and stable_after > 0, got {self}")


class RestartState:
    """One worker slot's history of deaths."""

    __slots__ = ("policy", "quick_deaths")

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.quick_deaths = 0

    def next_start(self, started: float, died: float) -> float:
        """The time to start the next worker, given when the dead one started and died."""
        p = self.policy
        if died - started >= p.stable_after:
            self.quick_deaths = 0
        n = self.quick_deaths
        self.quick_deaths += 1
        if n == 0:
            return died
        return died + min(p.max_delay, p.first_backoff * 2 ** (n - 1))
