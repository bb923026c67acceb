"""Running a request on a loaded model found by name: what the data plane and
in-process callers (a Python model's BLS call) share.

:func:`infer` looks the model up through the :data:`ModelLookup` it is
handed (the repository's ``ModelManager.get``), refuses a decoupled model
(its responses can only stream) and takes the model's path
(:func:`~inferd.model.path.run_model`); :func:`infer_stream` does the same for
a stream's request, decoupled or not. :class:`ModelDispatcher` binds a
lookup to the event loop the models run on; it implements the backends'
:class:`~inferd.backends.base.InferenceDispatcher`, which is how the Python
backend reaches other models without importing anything above it. Its
model loading calls go to the :class:`ModelControl` the repository gives it
(``inferd.repository.control.ModelLoading``: the model control mode's rules).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import AsyncIterator, Callable, Protocol

from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, Unimplemented
from inferd.facade import DECOUPLED_UNARY
from inferd.model.model import Model
from inferd.model.path import response, run_model, stream_model
from inferd.streaming import StreamLimits, StreamResponse
from inferd.types import InferenceRequest, InferenceResponse

# (name, version; 0 = as the version policy chooses) -> the loaded model, or the domain error a client sees.
ModelLookup = Callable[[str, int], Model]


class ModelControl(Protocol):
    """Loading and unloading models from inside the server (pb_utils' model loading API)."""

    async def load(self, name: str, config: str, files: dict[str, bytes]) -> None: ...

    async def unload(self, name: str, unload_dependents: bool) -> None: ...

    async def is_ready(self, name: str, version: int) -> bool: ...


def find(lookup: ModelLookup, request: InferenceRequest, decoupled_error: str = DECOUPLED_UNARY) -> Model:
    """The model a one-response request names. A failure ends ``request.trace``;
    ``decoupled_error``: the caller's words refusing a decoupled model."""
    trace = request.trace
    try:
        model = lookup(request.model_name, request.model_version)
    except InferdError as exc:
        if trace is not None:
            trace.end(exc)
        raise
    if model.decoupled:
        refused = Unimplemented(decoupled_error)
        if trace is not None:
            trace.end(refused)
        raise refused
    return model


async def infer(lookup: ModelLookup, request: InferenceRequest, clock: Clock,
                decoupled_error: str = DECOUPLED_UNARY) -> InferenceResponse:
    """Run one request on the model it names (:func:`find`, then its path). ``request.trace``,
    when set, is ended here on every path; outputs requested into shared memory are written there."""
    model = find(lookup, request, decoupled_error)
    return response(model, request, await run_model(model, request, clock))


async def infer_stream(lookup: ModelLookup, request: InferenceRequest, clock: Clock,
                       limits: StreamLimits | None = None) -> AsyncIterator[StreamResponse]:
    """Every response to one request as it comes (see :func:`~inferd.model.path.stream_model`);
    a model that cannot be found is the one final error."""
    try:
        model = lookup(request.model_name, request.model_version)
    except InferdError as exc:
        yield StreamResponse(error=exc, final=True)
        return
    # aclosing: a consumer that stops early closes stream_model now (which cancels the request),
    # not whenever the collector finalizes the suspended generator.
    async with aclosing(stream_model(model, request, clock, limits)) as items:
        async for item in items:
            yield item


class ModelDispatcher:
    """Requests from inside the server (a BLS call) to the models of one repository.

    ``loop`` is the event loop the models run on, known once :meth:`bind` is
    called there (the repository does it when it first loads); a caller on
    another thread submits to it. Such requests are not refused while the
    server drains: they serve requests already accepted.
    """

    def __init__(self, lookup: ModelLookup, clock: Clock | None = None,
                 control: ModelControl | None = None) -> None:
        self._lookup = lookup
        self._clock = clock or MonotonicClock()
        self._control = control
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Run ``request``; on :attr:`loop` only."""
        return await infer(self._lookup, request, self._clock)

    def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        """Every response to ``request`` (a BLS call with ``decoupled=True``); on :attr:`loop` only.
        Bounded by the default :class:`StreamLimits`: a caller that stops reading stalls the model."""
        return infer_stream(self._lookup, request, self._clock)

    # -- the model loading API -----------------------------------------------------

    def _controller(self, what: str) -> ModelControl:
        if self._control is None:
            raise Unimplemented(f"{what}: this server has no model repository to load models from")
        return self._control

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        await self._controller(f"failed to load '{name}'").load(name, config, files)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._controller(f"failed to unload '{name}'").unload(name, unload_dependents)

    async def model_is_ready(self, name: str, version: int) -> bool:
        return self._control is not None and await self._control.is_ready(name, version)
