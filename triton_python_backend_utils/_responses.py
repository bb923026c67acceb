"""``ResponseIterator``: what a BLS call with ``decoupled=True`` returns, the responses of
one request in the order the callee sent them, the last one the final (which may carry no
outputs: the callee sent the final flag alone)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from typing import Any, Callable

_END = object()


class ResponseIterator:
    """Iterate it (``for response in it``, also ``async for``); ``cancel()`` cancels the
    request in the callee. Responses are put by the server's event loop (:meth:`_put`),
    read by the model's thread; each one read gives the producer credit for one more, so
    at most a window of them waits here (the callee's own stream limit holds the rest)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._items: deque[Any] = deque()
        self._waiter: concurrent.futures.Future | None = None  # an ``async for`` waiting
        self._first = concurrent.futures.Future()  # set when the first response (or the end) arrives
        self._done = False
        # Set by the server when it starts the request: cancel it, and give back one credit.
        self._cancel: Callable[[], None] | None = None
        self._credit: Callable[[], None] | None = None

    # -- the server's side -----------------------------------------------------------

    def _put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            self._lock.notify()
            waiter, self._waiter = self._waiter, None
        if not self._first.done():
            self._first.set_result(self)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self) -> None:
        self._put(_END)

    # -- the model's side ------------------------------------------------------------

    def __iter__(self) -> "ResponseIterator":
        return self

    def __next__(self) -> Any:
        with self._lock:
            while not self._items:
                self._lock.wait()
            return self._take()

    def __aiter__(self) -> "ResponseIterator":
        return self

    async def __anext__(self) -> Any:
        while True:
            with self._lock:
                if self._items:
                    try:
                        return self._take()
                    except StopIteration:
                        raise StopAsyncIteration from None
                waiter = self._waiter = concurrent.futures.Future()
            await asyncio.wrap_future(waiter)

    def _take(self) -> Any:
        """The next item (the lock held); StopIteration at the end, which stays."""
        item = self._items[0]
        if item is _END:
            raise StopIteration
        self._items.popleft()
        if self._credit is not None:
            self._credit()
        return item

    def cancel(self) -> None:
        """Cancel the request: the callee sees ``is_cancelled()``; what it sent before still
        comes, then a CANCELLED error ends the responses."""
        if self._cancel is not None:
            self._cancel()
