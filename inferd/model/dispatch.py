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
Each model's instances get it through :meth:`ModelDispatcher.for_model`, which
names that model as the caller of every call; a repository that loads models
on demand sets :attr:`ModelDispatcher.cold` (``OnDemand.call_from``), awaited
before the lookup, so a BLS call into a model that is not loaded loads it.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import AsyncIterator, Awaitable, Callable, Protocol

from inferd.clock import Clock, MonotonicClock
from inferd.errors import InferdError, Unimplemented
from inferd.facade import DECOUPLED_UNARY
from inferd.model.loaded import Model
from inferd.model.path import response, run_model, stream_model
from inferd.streaming import StreamLimits, StreamResponse
from inferd.types import InferenceRequest, InferenceResponse

# (name, version; 0 = as the version policy chooses) -> the loaded model, or the domain error a client sees.
ModelLookup = Callable[[str, int], Model]
# (the model a call names, the request, the calling model's name or "") -> returns once that model is loaded
# (loading it), or raises the domain error the call gets (--model-control-mode on_demand).
ColdLoad = Callable[[str, InferenceRequest, str], Awaitable[None]]


class ModelControl(Protocol):
    """Loading and unloading models from inside the server (pb_utils' model loading API)."""

    async def load(self, name: str, config: str, files: dict[str, bytes], caller: str = "") -> None: ...

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
                 control: ModelControl | None = None, cold: ColdLoad | None = None) -> None:
        self._lookup = lookup
        self._clock = clock or MonotonicClock()
        self._control = control
        self.cold = cold  # None: a model that is not loaded answers UNAVAILABLE (its lookup's error)
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def for_model(self, caller: str) -> "CallerDispatcher":
        """This dispatcher as the instances of model ``caller`` hold it (their InstanceSpec's)."""
        return CallerDispatcher(self, caller)

    async def infer(self, request: InferenceRequest, caller: str = "") -> InferenceResponse:
        """Run ``request`` (made by model ``caller``, when known); on :attr:`loop` only."""
        if self.cold is not None:
            await self._loaded(request, caller)
        return await infer(self._lookup, request, self._clock)

    def infer_stream(self, request: InferenceRequest, caller: str = "") -> AsyncIterator[StreamResponse]:
        """Every response to ``request`` (a BLS call with ``decoupled=True``); on :attr:`loop` only.
        Bounded by the default :class:`StreamLimits`: a caller that stops reading stalls the model."""
        if self.cold is None:
            return infer_stream(self._lookup, request, self._clock)
        return self._cold_stream(request, caller)

    async def _cold_stream(self, request: InferenceRequest, caller: str) -> AsyncIterator[StreamResponse]:
        try:
            await self._loaded(request, caller)
        except InferdError as exc:
            yield StreamResponse(error=exc, final=True)
            return
        async with aclosing(infer_stream(self._lookup, request, self._clock)) as items:
            async for item in items:
                yield item

    async def _loaded(self, request: InferenceRequest, caller: str) -> None:
        """Wait for the model ``request`` names to be loaded (:attr:`cold`); a refusal ends its trace."""
        try:
            await self.cold(request.model_name, request, caller)  # type: ignore[misc]
        except InferdError as exc:
            if request.trace is not None:
                request.trace.end(exc)
            raise

    # -- the model loading API -----------------------------------------------------

    def _controller(self, what: str) -> ModelControl:
        if self._control is None:
            raise Unimplemented(f"{what}: this server has no model repository to load models from")
        return self._control

    async def load_model(self, name: str, config: str, files: dict[str, bytes], caller: str = "") -> None:
        await self._controller(f"failed to load '{name}'").load(name, config, files, caller)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._controller(f"failed to unload '{name}'").unload(name, unload_dependents)

    async def model_is_ready(self, name: str, version: int) -> bool:
        return self._control is not None and await self._control.is_ready(name, version)


class CallerDispatcher:
    """A :class:`ModelDispatcher` as one model's instances see it: every call is made by that model
    (``caller``), which the cold hook reads (a call made while the caller itself loads is refused)."""

    __slots__ = ("_parent", "caller")

    def __init__(self, parent: ModelDispatcher, caller: str) -> None:
        self._parent = parent
        self.caller = caller

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._parent.loop

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        return await self._parent.infer(request, self.caller)

    def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        return self._parent.infer_stream(request, self.caller)

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        await self._parent.load_model(name, config, files, self.caller)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._parent.unload_model(name, unload_dependents)

    async def model_is_ready(self, name: str, version: int) -> bool:
        return await self._parent.model_is_ready(name, version)
