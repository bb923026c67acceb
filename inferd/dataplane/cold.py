"""A one-response request for a model that is not loaded (``--model-control-mode on_demand``),
on the callback path (:meth:`DataPlane.submit`, the core's hand-off endpoint).

:class:`ColdRun` stands for the request while its model loads: it has what the
endpoint reads of a :class:`~inferd.model.ModelRun` (``finished``, ``cancel``,
``error``, ``request``) and, once the load ends, it starts the request on the
model's path and forwards a cancel to that run; the caller's ``on_done`` then
sees the real run (its outputs, its model). A load that fails, or a cancel
before it ends, answers the ColdRun itself (``model`` None, ``error`` set).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from inferd.types import InferenceRequest


class ColdRun:
    __slots__ = ("request", "on_done", "finished", "error", "outputs", "model", "_task", "_run")

    def __init__(self, request: InferenceRequest, on_done: Callable[[Any], None]) -> None:
        self.request = request
        self.on_done = on_done
        self.finished = False
        self.error: BaseException | None = None
        self.outputs = None
        self.model = None
        self._task: asyncio.Task | None = None
        self._run: Any = None  # the ModelRun, once the model is loaded

    def start(self, wait: Awaitable[None], submit: Callable[[], Any]) -> "ColdRun":
        """Await ``wait`` (the load, admission held) in a task, then ``submit()`` the request."""
        self._task = asyncio.get_running_loop().create_task(self._go(wait, submit))
        return self

    def done(self) -> bool:
        return self.finished

    async def _go(self, wait: Awaitable[None], submit: Callable[[], Any]) -> None:
        try:
            await wait
            if self.finished:  # cancelled meanwhile
                return
            run = submit()  # calls on_done itself, with the run
        except Exception as exc:
            self._fail(exc.with_traceback(None))
            return
        if run.finished:
            self.finished = True
        else:
            self._run = run

    def _fail(self, error: BaseException) -> None:
        if self.finished:
            return
        self.finished = True
        self.error = error
        on_done, self.on_done = self.on_done, None  # let go of it: see ModelRun._tell
        on_done(self)

    def cancel(self) -> None:
        """The caller has gone: stop waiting (the load goes on for others), or cancel the started run."""
        run = self._run
        if run is not None:
            self.finished = True
            run.cancel()
            return
        if self.finished:
            return
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        self.request.cancelled = True
        self._fail(asyncio.CancelledError())
