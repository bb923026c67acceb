"""``ResponseIterator``: what a BLS call with ``decoupled=True`` returns, the responses of
one request in the order the callee sent them, the last one the final (which may carry no
outputs: the callee sent the final flag alone)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections import deque
from typing import Any, Callable

_END = object()


class _Feed:
    """The responses on their way to one iterator: put by the server's event loop, taken by
    the model's thread. The server holds only this, never the iterator, so a model that drops
    its iterator unread lets it be collected, which cancels the call (:class:`ResponseIterator`)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.items: deque[Any] = deque()
        self.waiter: concurrent.futures.Future | None = None  # an ``async for`` waiting
        self.first: concurrent.futures.Future = concurrent.futures.Future()  # the first item arrived
        self.credit: Callable[[], None] | None = None  # one more response may come (set by the server)

    def put(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
            self.lock.notify()
            waiter, self.waiter = self.waiter, None
        if not self.first.done():
            self.first.set_result(None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def end(self) -> None:
        self.put(_END)

    def take(self) -> Any:
        """The next item (the lock held); StopIteration at the end, which stays."""
        item = self.items[0]
        if item is _END:
            raise StopIteration
        self.items.popleft()
        if self.credit is not None:
            self.credit()
        return item


class ResponseIterator:
    """Iterate it (``for response in it``, also ``async for``); ``cancel()`` cancels the
    request in the callee. Each response read gives the server credit for one more, so at
    most a window of them waits here (the callee's own stream limit holds the rest)."""

    def __init__(self) -> None:
        self._feed = _Feed()
        self._cancel: Callable[[], None] | None = None

    def _on_cancel(self, cancel: Callable[[], None]) -> None:
        """Set by the server when the call started: how to cancel it, also when this iterator
        is collected unread (``cancel`` must not refer to the iterator)."""
        self._cancel = cancel
        weakref.finalize(self, cancel)

    def __iter__(self) -> "ResponseIterator":
        return self

    def __next__(self) -> Any:
        feed = self._feed
        with feed.lock:
            while not feed.items:
                feed.lock.wait()
            return feed.take()

    def __aiter__(self) -> "ResponseIterator":
        return self

    async def __anext__(self) -> Any:
        feed = self._feed
        while True:
            with feed.lock:
                if feed.items:
                    try:
                        return feed.take()
                    except StopIteration:
                        raise StopAsyncIteration from None
                waiter = feed.waiter = concurrent.futures.Future()
            await asyncio.wrap_future(waiter)

    def cancel(self) -> None:
        """Cancel the request: the callee sees ``is_cancelled()``; what it sent before still
        comes, then a CANCELLED error ends the responses."""
        if self._cancel is not None:
            self._cancel()
