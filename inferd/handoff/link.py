"""A frontend worker's side of its core: channel, arenas, requests in flight, calls, mirrored state.

The worker owns no model and no setting: inference goes to the core through
the arenas (:class:`~inferd.handoff.pending.Pending`), every other request is a
call answered by the core (:meth:`WorkerLink.call`), and the little state the
worker needs on every request (is tracing on, what health says) is pushed by
the core in STATE messages when it changes, so the hot path never asks.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
from typing import Any

from inferd.errors import Unavailable
from inferd.facade import DRAINING
from inferd.handoff import wire
from inferd.handoff.arena import Arena, ArenaWriter
from inferd.handoff.channel import Channel
from inferd.handoff.pending import CORE_GONE, Pending, error_from

log = logging.getLogger(__name__)


class WorkerLink:
    def __init__(self, channel: Channel, config: dict[str, Any]) -> None:
        self.channel = channel
        self.config = config
        self.index: int = config.get("index", 0)
        self.inputs = ArenaWriter(Arena(*config["inputs"]))
        self.outputs = Arena(*config["outputs"])
        self.pending = Pending(channel, self.inputs)
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = 0
        self.draining = False
        # This worker's share of --max-queued-requests (0: no cap): what waits here, in the hand-off
        # or in the core counts against the server-wide cap before it reaches the core's.
        self.max_pending: int = config.get("max_pending", 0)
        self.max_queued: int = config.get("max_queued_requests", 0)
        self.tracing = False  # the core's tracing is on for some model: send trace carriers
        self.drain_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.core_draining = False  # the core sent DRAIN: it will say CLOSE when the whole server is drained
        self.close_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.update_state(config.get("state") or {})

    @classmethod
    async def connect(cls, sock: socket.socket, timeout: float = 60.0) -> "WorkerLink":
        """Open the channel and wait for the core's CONFIG."""
        loop = asyncio.get_running_loop()
        configured: asyncio.Future = loop.create_future()
        box: list[WorkerLink] = []

        def on_message(msg: list[Any]) -> None:
            if box:
                box[0].on_message(msg)
            elif msg[0] == wire.CONFIG and not configured.done():
                box.append(cls(channel, msg[1]))
                configured.set_result(box[0])

        channel = await Channel.open(sock, on_message, "core")
        assert channel.closed is not None
        done, _ = await asyncio.wait([configured, channel.closed], timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if configured not in done:
            raise SystemExit("frontend worker: the core sent no configuration")
        link = configured.result()
        channel.closed.add_done_callback(lambda _: link._core_gone())  # type: ignore[union-attr]
        return link

    # -- messages from the core ----------------------------------------------------------

    def on_message(self, msg: list[Any]) -> None:
        kind = msg[0]
        if kind in (wire.RESPONSE, wire.ERROR, wire.FINAL):
            self.pending.on_response(msg)
        elif kind == wire.REPLY:
            fut = self._calls.pop(msg[1], None)
            if fut is not None and not fut.done():
                if msg[2]:
                    fut.set_result(pickle.loads(msg[3]))
                else:
                    fut.set_exception(error_from(*msg[3]))
        elif kind == wire.STATE:
            self.update_state(msg[1])
        elif kind == wire.DRAIN:
            self.core_draining = True
            if not self.drain_requested.done():
                self.drain_requested.set_result(msg[1])
        elif kind == wire.CLOSE:
            if not self.close_requested.done():
                self.close_requested.set_result(None)
        else:
            log.warning("frontend %d: unknown message kind %r from the core", self.index, kind)

    def update_state(self, state: dict[str, Any]) -> None:
        if "tracing" in state:
            self.tracing = bool(state["tracing"])

    def _core_gone(self) -> None:
        self.pending.fail_all(Unavailable(CORE_GONE))
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(Unavailable(CORE_GONE))
        self._calls.clear()
        if not self.drain_requested.done():
            self.drain_requested.set_result(None)  # None: no grace, the core is gone
        if not self.close_requested.done():
            self.close_requested.set_result(None)

    @property
    def core_gone(self) -> bool:
        return self.pending.lost is not None

    # -- calls to the core ------------------------------------------------------------------

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the core's side (the control plane: never per inference)."""
        if self.pending.lost is not None:
            raise self.pending.lost
        self._next_call += 1
        cid = self._next_call
        fut = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        self.channel.send([wire.CALL, cid, method, pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)])
        try:
            return await fut
        finally:
            self._calls.pop(cid, None)

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise Unavailable(DRAINING)
        if self.pending.lost is not None:
            raise self.pending.lost

    def refuse_if_full(self, model: str) -> None:
        """Refuse (UNAVAILABLE) a request past this worker's share of the server-wide request cap,
        before its tensors are copied or anything is sent."""
        if self.max_pending and len(self.pending) >= self.max_pending:
            raise Unavailable(
                f"model '{model}': request rejected: the server is overloaded: this frontend worker already "
                f"holds {len(self.pending)} requests in flight, its share ({self.max_pending}) of "
                f"--max-queued-requests {self.max_queued} over the --frontend-workers; retry later")

    def hello(self) -> None:
        import os

        self.channel.send([wire.HELLO, self.index, os.getpid()])
