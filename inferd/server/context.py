"""The running server, for code that runs inside it.

A Python model's BLS call (``pb_utils.InferenceRequest(...).exec()``) runs on
the model's worker thread and must reach the server's data plane on the event
loop. :class:`InferenceServer` publishes both here when it starts; the Python
backend reads them only when a model makes such a call, never on the request
path of other models.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.server.dataplane import DataPlane


@dataclass(frozen=True, slots=True)
class ServerContext:
    dataplane: "DataPlane"
    loop: asyncio.AbstractEventLoop


_current: ServerContext | None = None


def set_current(context: ServerContext | None) -> None:
    """Publish (or, with None, withdraw) the server that in-process calls reach."""
    global _current
    _current = context


def current() -> ServerContext | None:
    """The running server, or None outside one (``inferd check``, unit tests)."""
    return _current
