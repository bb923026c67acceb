"""Triton's rate limiter: an instance executes only once the resources it needs are free.

``--rate-limit execution_count`` turns it on (``off``, the default, ignores every
``rate_limiter`` block, as Triton). Each instance group may say
``rate_limiter { resources [{ name, count, global }] priority }``: an instance of
the group needs ``count`` units of each resource, on its own device or, for a
``global`` one, across the server, for the whole of each execution. How many
units exist: ``--rate-limit-resource name:count[:device]`` (no device: every
device; a global resource takes the largest count given for its name), or by
default the largest count any loaded instance asks for, so every instance can
run. When explicit counts are given, every resource a model uses must be among
them (Triton's rule: an unlisted one has 0 units).

Instances waiting for resources are served in Triton's order: the one with the
lowest ``executions x max(priority, 1)`` first (a priority-2 instance gets half
the turns of a priority-1 one), and only the first may take resources: nothing
overtakes it, so a large request is never starved by small ones. Instances
whose group has no ``rate_limiter`` block are not limited at all.

Checked when an instance registers (model load): a resource used both as global
and per device, and an explicit count below what an instance needs, fail the load
with Triton's messages. Registration runs on loading threads; requests and
releases on the event loop; a lock keeps the counts whole, and the callbacks
that start executions run outside it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass
from typing import Callable

from inferd.config import RateLimitResource
from inferd.errors import ConfigError, InvalidArgument

GLOBAL = -1  # the device key of a global resource
EVERY_DEVICE = -2  # an explicit count given without a device

MODES = ("off", "execution_count")


def parse_resource(arg: str) -> tuple[str, int, int]:
    """``name:count[:device]`` (``--rate-limit-resource``) -> (name, count, device or EVERY_DEVICE)."""
    parts = arg.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise InvalidArgument(f"--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
                              f"'<resource_name>:<count>'. Got {arg}")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else EVERY_DEVICE
    except ValueError:
        raise InvalidArgument(f"--rate-limit-resource {arg}: count and device must be integers") from None
    if count < 0 or (len(parts) == 3 and device < 0):
        raise InvalidArgument(f"--rate-limit-resource {arg}: count and device must be >= 0")
    return parts[0], count, device


@dataclass(eq=False)
class Ticket:
    """One registered instance: what it needs, and how often it has executed."""

    limiter: "RateLimiter"
    name: str
    needs: dict[tuple[int, str], int]  # (device key, resource) -> units
    priority: int
    executions: int = 0
    holding: bool = False

    def request(self, start: Callable[[], None]) -> None:
        """Call ``start()`` (on the event loop) once the resources are allocated: at once when free."""
        self.limiter._request(self, start)

    def release(self) -> None:
        """The execution ended: give the resources back and let the next waiting instance start."""
        self.limiter._release(self)

    def close(self) -> None:
        """The instance is gone (unloaded, or its load failed)."""
        self.limiter._unregister(self)


class RateLimiter:
    def __init__(self, explicit: list[tuple[str, int, int]] | None = None) -> None:
        self._explicit = list(explicit or [])
        self._tickets: list[Ticket] = []
        self._available: dict[tuple[int, str], int] = {}
        self._allocated: dict[tuple[int, str], int] = {}
        self._waiting: list[tuple[int, int, Ticket, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    # -- registration (model load and unload) ----------------------------------------

    def register(self, model: str, instance: str, device: int, resources: tuple[RateLimitResource, ...],
                 priority: int) -> Ticket:
        """An instance of ``model`` on ``device`` (CPU instances are device 0, as in Triton).
        Raises ConfigError when the server's resources could never let it run."""
        needs = {(GLOBAL if r.is_global else device, r.name): r.count for r in resources}
        ticket = Ticket(self, instance, needs, priority)
        with self._lock:
            self._tickets.append(ticket)
            try:
                self._available = self._limits(model)
            except ConfigError:
                self._tickets.remove(ticket)
                raise
        return ticket

    def _unregister(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket in self._tickets:
                self._tickets.remove(ticket)
                self._available = self._limits("")

    def _limits(self, model: str) -> dict[tuple[int, str], int]:
        """Units of each (device, resource) the registered instances use; checked."""
        most: dict[tuple[int, str], int] = {}
        for t in self._tickets:
            for key, units in t.needs.items():
                most[key] = max(most.get(key, 0), units)
        global_names = {name for device, name in most if device == GLOBAL}
        for device, name in most:
            if device != GLOBAL and name in global_names:
                raise ConfigError(f"model '{model}': Resource \"{name}\" is present as both global and "
                                  "device-specific resource in the model configuration.")
        if not self._explicit:
            return most
        limits = {}
        for (device, name), needed in most.items():
            given = [count for n, count, d in self._explicit
                     if n == name and (device == GLOBAL or d in (device, EVERY_DEVICE))]
            count = max(given, default=0)
            if count < needed:
                raise ConfigError(
                    f"model '{model}': Resource count for \"{name}\" is limited to {count} which will prevent "
                    f"scheduling of one or more model instances, the minimum required count is {needed}"
                    + ("" if given else f" (give it with --rate-limit-resource {name}:{needed})"))
            limits[(device, name)] = count
        return limits

    def available(self) -> dict[tuple[int, str], int]:
        """(device or GLOBAL, resource) -> units in all (for tests and the start-up log)."""
        with self._lock:
            return dict(self._available)

    # -- executions (event loop) ---------------------------------------------------------

    def _request(self, ticket: Ticket, start: Callable[[], None]) -> None:
        with self._lock:
            scaled = ticket.executions * max(ticket.priority, 1)
            heapq.heappush(self._waiting, (scaled, next(self._seq), ticket, start))
            starts = self._allocate()
        for go in starts:
            go()

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if not ticket.holding:
                return
            ticket.holding = False
            ticket.executions += 1
            for key, units in ticket.needs.items():
                self._allocated[key] -= units
            starts = self._allocate()
        for go in starts:
            go()

    def _allocate(self) -> list[Callable[[], None]]:
        """Grant waiting instances in order while the first one's resources are free."""
        starts = []
        waiting = self._waiting
        while waiting:
            _, _, ticket, start = waiting[0]
            if any(self._allocated.get(key, 0) + units > self._available.get(key, 0)
                   for key, units in ticket.needs.items()):
                break
            heapq.heappop(waiting)
            for key, units in ticket.needs.items():
                self._allocated[key] = self._allocated.get(key, 0) + units
            ticket.holding = True
            starts.append(start)
        return starts
