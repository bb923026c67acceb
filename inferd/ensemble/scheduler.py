"""Running an ensemble request: each step as soon as its inputs exist.

A step's request takes the composing model's own path, as a client request
to that model would (look the model up now, validate, its scheduler, shape
its outputs, its statistics), so ensemble traffic shares batches with direct
traffic. Intermediate tensors are handed from step to step as the same
numpy arrays, or, between steps whose models run on one torch device (two
TorchScript models on cuda:0), as the device tensors themselves (DLPack-able
DeviceTensors), never copied through the host. Independent steps run concurrently as asyncio tasks; a chain
runs inline in the request's own task.

With ``max_inflight_requests`` N (Triton's field), at most N of the ensemble's requests are inside
each step, and at most N per step inside the ensemble at all: a request past that waits before its
first step, within its deadline, so neither a step's queue nor the intermediate tensors between
steps grow with a fast step's rate (docs/ENSEMBLES.md, "Bounded in-flight work").
"""

from __future__ import annotations

import asyncio
from functools import partial
from operator import is_
from typing import Any, Callable, Coroutine

import numpy as np

from inferd.clock import Clock, MonotonicClock
from inferd.config import ModelSpec
from inferd.ensemble.conditions import route_key
from inferd.ensemble.graph import EnsembleGraph, Step
from inferd.ensemble.grouping import Groups, groupable
from inferd.errors import DeadlineExceeded, InferdError, InvalidArgument, ModelExecutionError, Unavailable
from inferd.model import Model, ModelLookup, run_model
from inferd.observability.stats import ModelStats
from inferd.observability.tracing import ensemble_step
from inferd.scheduling.base import Completion, Inflight, Scheduler, run_task
from inferd.types import InferenceRequest, RequestedOutput


class EnsembleScheduler(Scheduler):
    def __init__(
        self, spec: ModelSpec, graph: EnsembleGraph, resolve: ModelLookup, stats: ModelStats,
        clock: Clock | None = None, problem: Callable[[], str | None] | None = None,
    ) -> None:
        self.spec = spec
        self.graph = graph
        self._resolve = resolve
        # Why the ensemble cannot serve now (its wiring no longer fits a reloaded
        # composing model, ...): asked until it answers None, then again only when
        # the composing models change (a nested ensemble checks its own).
        self._problem = problem
        self._fits: tuple = ()  # the composing models (route candidates too) _problem last found no problem with
        # Per step, the device its outputs stay on (its model's and every consumer's), for the
        # composing models _devices_for holds; None: the outputs come back to the host.
        self._devices_for: tuple = ()
        self._output_device: list[str | None] = [None] * len(graph.steps)
        self._stats = stats
        self._clock = clock or MonotonicClock()
        self._inflight = Inflight(stats)
        self._stopped = False
        limit = graph.max_inflight_requests
        # Back-pressure, as Triton's per-step limiter: at most ``limit`` of this ensemble's requests
        # inside each step at once. And at most ``limit`` per step inside the ensemble at all (running
        # a step, or holding intermediate tensors between two): past that a request waits before its
        # first step, holding only its inputs, so a fast step cannot pile tensors up before a slow one.
        self._slots = [asyncio.Semaphore(limit) for _ in graph.steps] if limit else None
        self._places = limit * len(graph.steps)
        self._admission = asyncio.Semaphore(self._places) if limit else None
        # Every model a routed step may run besides its default: with the steps' models, those whose
        # identity says whether _problem must be asked again (a reloaded route model too).
        self._candidates = [(s, name) for s in graph.steps for name in s.candidates if name != s.model_name]
        self._requested = [[RequestedOutput(key) for key, _ in s.output_map] for s in graph.steps]
        # What each step's request asks for, for the composing models _devices_for holds: None (every
        # output, the same thing, with nothing to check or look for in shared memory per request) for a
        # plain step that maps all of its model's outputs; else its mapped outputs.
        self._asks: list[list[RequestedOutput] | None] = list(self._requested)
        self._describe_step = [partial(self._describe, s) for s in graph.steps]
        # The statistics key each plain step counts a run under: (step, model, outcome).
        self._ran = [(s.index, s.model_name, "ran") for s in graph.steps]
        self._plain = [s.plain for s in graph.steps]  # read per step: the property's call, once
        # A step runs through _call directly, or through _limited when max_inflight_requests is set.
        self._run_step = self._call if self._slots is None else self._limited
        # Concurrent requests through the steps as one (grouping.py); sized with the composing models.
        self._groups = Groups(graph.name, self._grouped, self._inflight)

    # -- Scheduler ---------------------------------------------------------

    def inflight(self) -> int:
        return self._inflight.count

    async def stop(self) -> None:
        self._stopped = True
        await self._inflight.drained()

    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """:meth:`Scheduler.submit`: the request's steps run in a task (each step's request is
        its model's, batched there), alone or grouped with concurrent requests (grouping.py).
        Refused at once while unloading, or when a composing model is gone or no longer fits."""
        if self._stopped:
            raise Unavailable(f"ensemble '{self.graph.name}' is unloading and takes no new requests")
        self._check_models()
        groups = self._groups
        if groups.cap and rows <= groups.cap and groupable(request):
            return groups.join(request, rows, completion)
        return run_task(self._whole(request, rows), completion)

    def _check_models(self) -> None:
        """Fail fast, before any step runs, when a composing model is gone or no longer fits; on a
        change of composing models, what follows from them (devices, asks, grouping) is worked out."""
        graph = self.graph
        models = tuple([self._model(step) for step in graph.steps])
        # Compared by identity with map(operator.is_): no Python call per step, on every request.
        if self._problem is not None:
            used = models + self._route_models() if self._candidates else models
            fits = self._fits
            if len(fits) != len(used) or not all(map(is_, used, fits)):
                problem = self._problem()
                if problem:
                    raise Unavailable(f"ensemble '{graph.name}' is not ready: {problem}")
                self._fits = used
        if len(self._devices_for) != len(models) or not all(map(is_, models, self._devices_for)):
            self._output_device = self._output_devices(models)
            self._asks = [None if step.plain and {k for k, _ in step.output_map} == set(model.spec.outputs) else asks
                          for step, model, asks in zip(graph.steps, models, self._requested)]
            self._groups.cap = self._group_rows(models)
            self._groups.window = sum(max(1, len(getattr(m.scheduler, "workers", ()))) for m in models)
            self._devices_for = models

    def _group_rows(self, models: tuple[Model, ...]) -> int:
        """The most rows a group of requests may carry through the steps: the smallest max_batch_size
        along the way; 0 (no grouping) unless every step is plain, there is no max_inflight_requests,
        and every composing model takes host tensors and joins the rows of what it batches."""
        if self._slots is not None or self.spec.max_batch_size <= 0 or not all(self._plain):
            return 0
        caps = [self.spec.max_batch_size]
        for model in models:
            if model.cache is not None or model.decoupled or model.tensor_device is not None:
                return 0
            caps.append(model.scheduler.merges_rows())
        return min(caps)

    async def _whole(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        """One request through the steps (one grouping.py does not group), in flight meanwhile."""
        graph = self.graph
        self._inflight.enter(request.background)
        try:
            if self._admission is None:
                # No limit, no queue (its steps queue at their models): a queue stage of zero
                # length per request, which perf_analyzer also uses to find the version served.
                self._stats.record_queue(0)
                outputs = await (self._run_sequence(request) if graph.sequence else self._run(request))
            else:
                outputs = await self._admitted(request)
        finally:
            self._inflight.leave(request.background)
        stats = self._stats
        stats.inference_count += rows
        stats.execution_count += 1
        return outputs

    async def _grouped(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        """A group's run through the steps (grouping.py): ``request`` stands for ``request.members``
        of the ensemble's requests, each counted here as :meth:`_whole` counts one."""
        stats = self._stats
        stats.record_queue(0, request.members)
        outputs = await (self._run_sequence(request) if self.graph.sequence else self._run(request))
        stats.inference_count += rows
        stats.execution_count += request.members
        return outputs

    async def _admitted(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        """The request, after one of the ensemble's places (max_inflight_requests per step); the
        wait before its first step is the ensemble's queue stage."""
        assert self._admission is not None
        start = self._clock.now()
        await self._acquire(self._admission, request, lambda: (
            f"while it waited before its first step for one of the ensemble's {self._places} places "
            f"(max_inflight_requests {self.graph.max_inflight_requests} for each of its {len(self.graph.steps)} steps)"))
        try:
            self._stats.record_queue(max(0, int((self._clock.now() - start) * 1e9)))
            return await (self._run_sequence(request) if self.graph.sequence else self._run(request))
        finally:
            self._admission.release()

    async def _acquire(self, slot: asyncio.Semaphore, request: InferenceRequest, waited: Callable[[], str]) -> None:
        """``slot``, within the request's deadline (DeadlineExceeded saying what ``waited`` for).
        A cancelled request stops waiting at once (CancelledError) and holds nothing."""
        deadline = request.deadline
        if deadline is None or not slot.locked():  # free now: no timer needed
            await slot.acquire()
            return
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock.now())):
                await slot.acquire()
        except TimeoutError:
            raise DeadlineExceeded(f"ensemble '{self.graph.name}': the request's deadline passed {waited()}") from None

    # -- the graph -----------------------------------------------------------

    async def _run_sequence(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        """A chain: no two steps can ever be ready at once, so each runs in this task, in order."""
        graph = self.graph
        steps = graph.steps
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        for i in graph.sequence:
            step = steps[i]
            outputs = await self._run_step(step, tensors, request)
            for key, tensor in step.output_map:
                tensors[tensor] = outputs[key]
        return {name: tensors[name] for name in graph.outputs}

    async def _run(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        graph = self.graph
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        waiting = list(graph.waits_for)
        ready = list(graph.start)
        running: dict[asyncio.Task, Step] = {}
        try:
            while ready or running:
                if len(ready) == 1 and not running:
                    # Only one step can run: run it in this task, not in a task of its own.
                    step = graph.steps[ready.pop()]
                    self._publish(step, await self._run_step(step, tensors, request), tensors, waiting, ready)
                    continue
                while ready:
                    step = graph.steps[ready.pop()]
                    running[asyncio.ensure_future(self._run_step(step, tensors, request))] = step
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    self._publish(step, task.result(), tensors, waiting, ready)
        except BaseException:
            # A step failed or the request was cancelled: the other steps run for nobody.
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            raise
        return {name: tensors[name] for name in graph.outputs}

    def _output_devices(self, models: tuple[Model, ...]) -> list[str | None]:
        """For each step, the torch device its outputs can stay on: the one its model and every
        step that reads them run on, when none of them is an output of the ensemble. Between
        TorchScript steps on one GPU the intermediate tensors then never visit the host."""
        graph = self.graph
        final = set(graph.outputs)
        devices: list[str | None] = []
        for step, model in zip(graph.steps, models):
            device = model.tensor_device
            for _, tensor in step.output_map:
                readers = graph.consumers.get(tensor, ())
                if (tensor in final or not readers or not step.plain
                        or any(models[c].tensor_device != device or not graph.steps[c].plain for c in readers)):
                    device = None
                    break
            devices.append(device)
        return devices

    def _publish(self, step: Step, outputs: dict[str, np.ndarray], tensors: dict[str, np.ndarray],
                 waiting: list[int], ready: list[int]) -> None:
        consumers = self.graph.consumers
        for key, tensor in step.output_map:
            tensors[tensor] = outputs[key]
            for c in consumers.get(tensor, ()):
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)

    def _model(self, step: Step) -> Model:
        try:
            return self._resolve(step.model_name, step.model_version)
        except InferdError as exc:
            raise self._wrap(step, exc) from None

    def _wrap(self, step: Step, exc: InferdError, model: str | None = None) -> InferdError:
        version = "" if step.model_version == 0 else f" version {step.model_version}"
        routed = "" if model is None or model == step.model_name else f", routed to '{model}'"
        error = type(exc)(f"ensemble '{self.graph.name}' step {step.index} (model '{step.model_name}'{version}"
                          f"{routed}): {exc.message}")
        return error

    async def _limited(self, step: Step, tensors: dict[str, np.ndarray], request: InferenceRequest) -> dict[str, np.ndarray]:
        """One step, after one of its max_inflight_requests slots."""
        assert self._slots is not None
        slot = self._slots[step.index]
        await self._acquire(slot, request, lambda: (
            f"while {step.label} waited for one of its {self.graph.max_inflight_requests} max_inflight_requests slots"))
        try:
            return await self._call(step, tensors, request)
        finally:
            slot.release()

    def _call(self, step: Step, tensors: dict[str, np.ndarray],
              request: InferenceRequest) -> Coroutine[Any, Any, dict[str, np.ndarray]]:
        """One step through its composing model's own path, as the data plane runs a request;
        a conditional or routed step decides first (:meth:`_decide`). Not a coroutine itself
        (neither is :meth:`_execute`): it checks and builds the step's request now and returns
        the awaitable of its path (a refusal raises here), so a step resumes one frame fewer
        each time it waits; the step starts when the caller awaits it, in the caller's task."""
        deadline = request.deadline
        if deadline is not None and self._clock.now() >= deadline:
            raise DeadlineExceeded(
                f"ensemble '{self.graph.name}': the request's deadline passed before {step.label} could start")
        if not self._plain[step.index]:
            return self._decide(step, tensors, request)
        steps = self._stats.steps
        key = self._ran[step.index]
        steps[key] = steps.get(key, 0) + request.members
        try:
            model = self._resolve(step.model_name, step.model_version)
        except InferdError as exc:
            raise self._wrap(step, exc) from None
        return self._execute(step, model, {k: tensors[t] for k, t in step.input_map}, request,
                             "ran", self._describe_step[step.index])

    def _execute(self, step: Step, model: Model, inputs: dict[str, np.ndarray], request: InferenceRequest,
                 outcome: str, describe: Callable[[Exception], InferdError]) -> Coroutine[Any, Any, dict[str, np.ndarray]]:
        """The step's request to ``model``, as :func:`run_model`'s awaitable (see :meth:`_call`)."""
        trace = request.trace
        if trace is not None:
            # A span per step; the composing model's queue/compute spans nest under it.
            trace = ensemble_step(trace, f"{step.index} {step.model_name}", model.spec.name, model.version)
            assert trace is not None
            trace.set("inferd.step.outcome", outcome)
        sub = InferenceRequest(
            model_name=model.spec.name,
            inputs=inputs,
            model_version=step.model_version,
            id=request.id,
            requested_outputs=self._asks[step.index],
            parameters=request.parameters,
            priority=request.priority,
            timeout_us=request.timeout_us,
            deadline=request.deadline,
            trace=trace,
            output_device=self._output_device[step.index],
            members=request.members,
        )
        return run_model(model, sub, self._clock, describe)

    # -- conditional and routed steps --------------------------------------------------

    async def _decide(self, step: Step, tensors: dict[str, np.ndarray], request: InferenceRequest) -> dict[str, np.ndarray]:
        """A conditional step runs where its predicate holds (the request, or its rows) and takes its
        fallback tensors elsewhere; a routed step runs the model its route picks."""
        name = self._routed(step, tensors, request) if step.route is not None else step.model_name
        when = step.when
        mask = None
        if when is not None:
            value = _host(tensors[when.tensor])
            try:
                if when.per_row:
                    mask = when.rows(value)
                    runs = bool(mask.all())
                    if runs:
                        mask = None
                    elif not mask.any():
                        return self._skip(step, name, tensors, request, "skipped")
                elif not when.holds(value):
                    return self._skip(step, name, tensors, request, "skipped")
            except (ValueError, TypeError) as exc:
                raise InvalidArgument(
                    f"ensemble '{self.graph.name}' {step.label}: predicate '{when.text}' cannot read tensor "
                    f"'{when.tensor}' (shape {list(value.shape)}): it {exc}") from None
        model = self._routed_model(step, name)
        describe = self._describe_step[step.index] if name == step.model_name else partial(self._describe, step, model=name)
        inputs = {k: tensors[t] for k, t in step.input_map}
        if mask is None:
            self._count(step, name, "ran")
            return await self._execute(step, model, inputs, request, "ran", describe)
        # Some rows: run those, and put each output's rows back in order among its fallback's.
        self._count(step, name, "split")
        try:
            picked = {k: _host(a)[mask] for k, a in inputs.items()}
        except IndexError as exc:
            raise InvalidArgument(f"ensemble '{self.graph.name}' {step.label}: predicate '{when.text}' gives "  # type: ignore[union-attr]
                                  f"{mask.size} rows, but the step's inputs do not: {exc}") from None
        outputs = await self._execute(step, model, picked, request, f"split {int(mask.sum())} of {mask.size} rows",
                                      describe)
        fallback = dict(step.otherwise)
        merged = {}
        for key, tensor in step.output_map:
            rows = np.array(_host(tensors[fallback[tensor]]), copy=True)
            try:
                rows[mask] = _host(outputs[key])
            except (ValueError, IndexError) as exc:
                raise InvalidArgument(
                    f"ensemble '{self.graph.name}' {step.label}: output '{key}' (shape {list(outputs[key].shape)} "
                    f"for {int(mask.sum())} rows) does not fit the rows of its fallback '{fallback[tensor]}' "
                    f"(shape {list(rows.shape)}): {exc}") from None
            merged[key] = rows
        return merged

    def _skip(self, step: Step, name: str, tensors: dict[str, np.ndarray], request: InferenceRequest,
              outcome: str) -> dict[str, np.ndarray]:
        """The step does not run: each tensor it produces is its fallback."""
        self._count(step, name, outcome)
        if request.trace is not None:
            span = ensemble_step(request.trace, f"{step.index} {step.model_name}", name)
            assert span is not None
            span.set("inferd.step.outcome", outcome)
            span.end()
        fallback = dict(step.otherwise)
        return {key: tensors[fallback[tensor]] for key, tensor in step.output_map}

    def _routed(self, step: Step, tensors: dict[str, np.ndarray], request: InferenceRequest) -> str:
        route = step.route
        assert route is not None
        where = f"ensemble '{self.graph.name}' {step.label}"
        parameter = route.parameter
        if parameter is not None:
            if parameter not in request.parameters:
                raise InvalidArgument(f"{where}: the step is routed by request parameter '{parameter}', which the "
                                      f"request does not carry (keys: {route.keys()})")
            value = request.parameters[parameter]
        else:
            array = _host(tensors[route.by])
            if array.size < 1 or any(x != array.flat[0] for x in array.flat):
                raise InvalidArgument(f"{where}: route_by tensor '{route.by}' must hold one key for the request, "
                                      f"got {array.size} different values")
            value = array.flat[0]
        key = route_key(value)
        name = route.choose(key)
        if name is None:
            raise InvalidArgument(f"{where}: no route for key '{key}' (from {route.by}); routes: {route.keys()}")
        return name

    def _route_models(self) -> tuple[Model | None, ...]:
        """The routed steps' other candidates, as loaded now (None: gone, which _problem explains)."""
        found: list[Model | None] = []
        for step, name in self._candidates:
            try:
                found.append(self._resolve(name, step.model_version))
            except InferdError:
                found.append(None)
        return tuple(found)

    def _routed_model(self, step: Step, name: str) -> Model:
        if name == step.model_name:
            return self._model(step)
        try:
            return self._resolve(name, step.model_version)
        except InferdError as exc:
            raise self._wrap(step, exc, name) from None

    def _count(self, step: Step, name: str, outcome: str) -> None:
        steps = self._stats.steps
        key = (step.index, name, outcome)
        steps[key] = steps.get(key, 0) + 1

    def _describe(self, step: Step, exc: Exception, model: str | None = None) -> InferdError:
        if isinstance(exc, InferdError):
            return self._wrap(step, exc, model)
        name = model or step.model_name
        return self._wrap(step, ModelExecutionError(f"model '{name}' failed: {type(exc).__name__}: {exc}"), model)


def _host(array: Any) -> np.ndarray:
    """A tensor a decision reads, on the host (a DeviceTensor copies itself once)."""
    return array if isinstance(array, np.ndarray) else np.asarray(array)
