"""The protocol-neutral data plane: the one :class:`DataPlaneAPI` both frontends call.

Frontends decode the wire into :class:`InferenceRequest` (numpy arrays) and
encode what comes back; everything in between happens here or below: refuse
new work while draining, resolve tensors in shared memory, start the trace,
find the model, and take its path (validate, schedule, shape, count:
:mod:`inferd.model`). The server's wiring (:mod:`inferd.serve.one_process`) drives
its lifecycle (:meth:`DataPlane.load_models`, :meth:`DataPlane.drain`,
:meth:`DataPlane.close`); those are not part of the façade.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from inferd.batchjobs import OpenAIBatches, OpenAILines
from inferd.clock import Clock, MonotonicClock
from inferd.facade import OpenAIModel
from inferd.dataplane.admission import Admission, request_bytes
from inferd.dataplane.batches import BatchService
from inferd.dataplane.cold import ColdRun
from inferd.dataplane.shared_memory import CLIENT_SHM_DISABLED, SharedMemoryManager
from inferd.dataplane.shedding import QueueDelay
from inferd.errors import DeadlineExceeded, Draining, InferdError, InvalidArgument, Unimplemented
from inferd.facade import (
    DECOUPLED_UNARY, DRAINING, CudaRegionStatus, IndexEntry, ModelMetadata, RegionStatus, ServerMetadata, TensorMetadata,
    TraceCarrier,
)
from inferd.model import Model, ModelRun, submit_model
from inferd.model import infer_stream as model_infer_stream
from inferd.model.readiness import user_ready
from inferd.observability import custom_metrics
from inferd.observability.log_settings import LogSettings
from inferd.observability.stats import ModelStatistics
from inferd.observability.tracing import Tracing
from inferd.repository import ModelManager, control
from inferd.streaming import StreamLimits, StreamResponse
from inferd.types import InferenceRequest, InferenceResponse

# ServerMetadata's name: Triton's own clients check for "triton" (README, "Server name"); the
# version is inferd's, so a client can still tell which server answers.
SERVER_NAME = "triton"
SERVER_VERSION = "0.1.0"
EXTENSIONS = [
    "classification", "sequence", "model_repository", "schedule_policy", "model_configuration", "statistics",
    "binary_tensor_data", "parameters", "model_repository(unload_dependents)", "system_shared_memory", "trace", "logging",
]
# A request whose client's deadline passed before the data plane saw it (waiting in the transport, the
# hand-off or a cold model's load) is refused, not run for nobody (issue 42).
_PASSED = "model '{model}': the request's deadline passed {us} us before inferd admitted it; it was not run"
# The custom metric family an ORCA load report reads (the TensorRT-LLM backend's name, as Triton's orca_http).
KV_CACHE_BLOCK_FAMILY = "nv_trt_llm_kv_cache_block_metrics"


class DataPlane:
    """Implements :class:`~inferd.facade.DataPlaneAPI` over a :class:`ModelManager`."""

    def __init__(self, manager: ModelManager, clock: Clock | None = None, *, tracing: Tracing | None = None,
                 logs: LogSettings | None = None, server_name: str = SERVER_NAME,
                 admission: Admission | None = None, batch_dir: Path | None = None,
                 stream_limits: StreamLimits | None = None,
                 shedding: QueueDelay | None = None,
                 openai_lines: Callable[["DataPlane"], OpenAILines] | None = None, allow_client_shm: bool = False) -> None:
        self.manager = manager
        self.server_name = server_name
        # Server-wide caps on the requests inside (--max-queued-requests / --max-queued-bytes).
        self.admission = admission or Admission()
        # How far a stream's client may fall behind its model (--stream-max-responses, ...).
        self.stream_limits = stream_limits or StreamLimits()
        # The bound on queueing delay (--queue-delay-*; target 0: off): these settings, one controller
        # per model (by name) made from them.
        self.shedding = shedding or QueueDelay()
        self._shedding_on = self.shedding.enabled  # read per request: the property's call, once
        self._delays: dict[str, QueueDelay] = {}
        self.clock = clock or MonotonicClock()
        # Batch jobs (POST /v2/batches, and OpenAI's /v1/batches when the wiring says how its lines run over
        # this data plane: openai_lines), kept in batch_dir; None: off.
        self.batches = (BatchService(manager, batch_dir, self.clock, openai_lines(self) if openai_lines else None)
                        if batch_dir is not None else None)
        self.live = True
        self.draining = False
        self.shared_memory = SharedMemoryManager()
        # --allow-client-shm: clients may register (and unregister) shared memory regions. Off by default,
        # as Triton since 2026-04: a region maps a client's memory into the server. Decided here, where
        # the regions live, so every frontend (a worker's forwards its calls here) answers alike.
        self.allow_client_shm = allow_client_shm
        self.tracing = tracing or Tracing()  # None: off (the server's comes from --trace-config)
        self.logs = logs or LogSettings()
        self.loading = False  # the server's start-up loading: not ready yet

    # -- lifecycle (the server's wiring, not the façade) ------------------------------

    async def load_models(self) -> None:
        """Start-up: load every model the control mode asks for; then ready."""
        try:
            await self.manager.load_all()
        finally:
            self.loading = False
        if self.batches is not None:
            await self.batches.start()  # resume the jobs a previous server left unfinished

    async def stop_batches(self) -> None:
        """A stop has begun: batch jobs take no more lines; they resume at the next start."""
        if self.batches is not None:
            await self.batches.stop()

    def drain(self) -> None:
        """A stop has begun: not ready, and new inference requests are refused; accepted
        ones finish (in-process calls, a Python model's BLS, are not refused: they serve them)."""
        self.draining = True

    def inflight(self) -> int:
        """Client requests accepted and not yet answered, over every model."""
        return self.admission.requests

    async def drained(self) -> None:
        """Return once every accepted client request has been answered (a stop waits for it)."""
        await self.admission.idle()

    async def close(self) -> None:
        """Release the models, the shared memory mappings and the trace exporter."""
        await self.manager.stop()
        self.shared_memory.close()
        self.tracing.shutdown()

    # -- health and metadata ---------------------------------------------------

    async def server_live(self) -> bool:
        return self.live

    async def server_ready(self) -> bool:
        """:meth:`ready_now`, and every loaded model with a check of its own (a Python model's
        ``is_ready``) ready by its word, as Triton's strict readiness asks them."""
        if not self.ready_now():
            return False
        answers = await asyncio.gather(*(user_ready(m) for m in self.manager.models()))
        return all(answers)

    def ready_now(self) -> bool:
        """:meth:`server_ready`, for code in this process that cannot await (the metrics scrape)."""
        return self.live and not self.draining and not self.loading and self.manager.all_ready()

    async def model_ready(self, name: str, version: int = 0) -> bool:
        """Loaded, serving, and (a Python model's ``is_ready``) ready by its own word."""
        if self.draining or not self.manager.is_ready(name, version):
            return False
        return await user_ready(self.manager.get(name, version))

    async def server_metadata(self) -> ServerMetadata:
        cuda = ["cuda_shared_memory"] if self.manager.gpus.gpus() else []  # as a GPU build of Triton lists it
        return ServerMetadata(self.server_name, SERVER_VERSION, list(EXTENSIONS) + cuda)

    async def model_metadata(self, name: str, version: int = 0) -> ModelMetadata:
        await self._loaded(name)
        model = self.manager.get(name, version)
        spec = model.spec
        lead = [-1] if spec.max_batch_size > 0 else []
        versions = [str(m.version) for m in self.manager.models() if m.name == name]
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=_platform(model),
            inputs=[TensorMetadata(t.name, t.datatype.name, lead + list(t.dims)) for t in spec.inputs.values()],
            outputs=[TensorMetadata(t.name, t.datatype.name, lead + list(t.dims)) for t in spec.outputs.values()],
        )

    async def model_config(self, name: str, version: int = 0) -> Any:
        await self._loaded(name)
        return self.manager.get(name, version).spec.config

    async def model_statistics(self, name: str = "", version: int = 0) -> list[ModelStatistics]:
        if not name:
            models = self.manager.models()
        elif version:
            models = [self.manager.get(name, version)]
        else:
            models = [m for m in self.manager.models() if m.name == name]
            if not models:
                self.manager.get(name)  # raises the right error
        return [m.stats.snapshot() for m in sorted(models, key=lambda m: (m.name, m.version))]

    # -- model repository (model control) ------------------------------------------

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.manager.index(ready_only=ready_only)

    async def openai_models(self, name: str = "", assets: bool = False) -> list[OpenAIModel]:
        if name:
            models = [self.manager.get(name)]
        else:
            names = sorted({m.name for m in self.manager.models() if m.spec.openai is not None})
            models = [self.manager.get(n) for n in names if self.manager.is_ready(n)]
        out = []
        for model in models:
            spec = model.spec.openai
            if spec is not None:
                out.append(OpenAIModel(model.name, model.version, spec if assets else spec.without_assets()))
        return out

    async def load_model(self, name: str, parameters: Mapping[str, object] | None = None,
                         repository: str = "") -> None:
        """RepositoryModelLoad: (re)load ``name``; ``parameters``: plain values (``config``: a
        JSON ModelConfig; ``file:<path>``: bytes, the files of an override model folder).
        Explicit and on_demand modes (where the model is pinned: never evicted)."""
        control.require_explicit(self.manager, f"failed to load '{name}'")
        _check_repository(repository, name)
        config, files = control.load_parameters(name, parameters or {})
        if self.manager.demand is not None:
            await self.manager.demand.load_pinned(name, config, files)
        else:
            await self.manager.load_model(name, config, files)

    async def unload_model(self, name: str, parameters: Mapping[str, object] | None = None,
                           repository: str = "") -> None:
        """RepositoryModelUnload (``unload_dependents``: also the ensembles that use it). Explicit and
        on_demand modes (where it unpins: the model loads again on its next request)."""
        control.require_explicit(self.manager, f"failed to unload '{name}'")
        _check_repository(repository, name)
        dependents = control.unload_parameters(name, parameters or {})
        if self.manager.demand is not None:
            await self.manager.demand.unload(name, dependents)
        else:
            await self.manager.unload_model(name, dependents)

    # -- system shared memory --------------------------------------------------------

    def _check_client_shm(self) -> None:
        """Registering and unregistering a region need --allow-client-shm (UNIMPLEMENTED / 501 without
        it, in Triton's words); the status calls answer either way (no regions without it)."""
        if not self.allow_client_shm:
            raise Unimplemented(CLIENT_SHM_DISABLED)

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_client_shm()
        self.shared_memory.register(name, key, offset, byte_size)

    async def shm_status(self, name: str = "") -> list[RegionStatus]:
        return self.shared_memory.status(name)

    async def shm_unregister(self, name: str = "") -> None:
        self._check_client_shm()
        self.shared_memory.unregister(name)

    # -- CUDA shared memory ----------------------------------------------------------

    async def cuda_shm_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_client_shm()
        self.shared_memory.register_cuda(name, raw_handle, device_id, byte_size)

    async def cuda_shm_status(self, name: str = "") -> list[CudaRegionStatus]:
        return self.shared_memory.status(name, kind="cuda")

    async def cuda_shm_unregister(self, name: str = "") -> None:
        self._check_client_shm()
        self.shared_memory.unregister(name, kind="cuda")

    # -- tracing and logging ----------------------------------------------------------

    async def trace_settings(self, model: str = "",
                             changes: Mapping[str, list[str]] | None = None) -> dict[str, list[str]]:
        return self.tracing.update(model, changes) if changes else self.tracing.settings(model)

    async def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self.logs.update(changes) if changes else self.logs.get()

    async def kv_cache_blocks(self) -> dict[str, float]:
        found: dict[str, float] = {}
        registry = custom_metrics.REGISTRY
        hosts = self.manager.hosts
        if hosts is not None and hosts.instances:  # a hosted model registers in its host's registry
            registry = registry.merged(await hosts.custom_metrics())
        for labels, value in registry.samples(KV_CACHE_BLOCK_FAMILY):
            kind = labels.get("kv_cache_block_type")
            if kind in ("tokens_per", "used", "max"):
                found[kind] = value
        return found

    # -- inference -----------------------------------------------------------------

    def tracing_on(self) -> bool:
        return self.tracing.enabled

    async def infer(self, request: InferenceRequest, decoupled_error: str = DECOUPLED_UNARY,
                    trace_carrier: TraceCarrier | None = None) -> InferenceResponse:
        """:meth:`submit` for a caller that awaits (the in-process frontends): the response, or the
        request's error raised. Cancelling the awaiting task cancels the request."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        run = self.submit(request, lambda ended: future.done() or future.set_result(ended), decoupled_error,
                          trace_carrier)
        try:
            ended = await future  # the model's run (a cold request's ``run`` is its stand-in)
        except asyncio.CancelledError:
            run.cancel()
            raise
        if ended.error is not None:
            raise ended.error
        model = ended.model
        return InferenceResponse(model_name=model.spec.name, model_version=model.version, outputs=ended.outputs,
                                 id=request.id)

    def submit(self, request: InferenceRequest, on_done: Callable[[ModelRun], None],
               decoupled_error: str = DECOUPLED_UNARY, trace_carrier: TraceCarrier | None = None,
               more: bool = False) -> ModelRun:
        """The one way a request reaches its model (the core's hand-off endpoint calls it; :meth:`infer`
        awaits it): the server's checks, then the model's path
        (:func:`~inferd.model.path.submit_model`; ``more``: other requests follow this turn).
        Raises what refuses the request before it reaches a model; otherwise ``on_done(run)``
        comes once, with ``run.outputs`` or ``run.error`` (a CancelledError once cancelled).
        A request for a model that is not loaded (on_demand) waits for its load in a task
        (:class:`~inferd.dataplane.cold.ColdRun`), then takes the same path."""
        demand = self.manager.demand
        if demand is not None and demand.cold(request.model_name):
            if self.draining:
                raise Draining(DRAINING)
            return ColdRun(request, on_done).start(  # type: ignore[return-value]
                self._wait_loaded(request), partial(self._submit, request, on_done, decoupled_error, trace_carrier))
        # _submit, written out: once per request
        model, nbytes = self._admit(request, decoupled_error, trace_carrier)
        return submit_model(model, request, self.clock, partial(self._answered, nbytes, on_done), more=more)

    def _submit(self, request: InferenceRequest, on_done: Callable[[ModelRun], None], decoupled_error: str,
                trace_carrier: TraceCarrier | None) -> ModelRun:
        """A cold request's model is loaded: on to its path (its load was counted as a miss, once)."""
        model, nbytes = self._admit(request, decoupled_error, trace_carrier)
        return submit_model(model, request, self.clock, partial(self._answered, nbytes, on_done))

    async def _wait_loaded(self, request: InferenceRequest) -> None:
        """on_demand: wait until the model ``request`` names is loaded (loading it), its bytes counted
        against the server's caps meanwhile (a cold model's waiting requests are held too)."""
        if self.draining:
            raise Draining(DRAINING)
        nbytes = request_bytes(request.inputs)
        self.admission.admit(nbytes, request.model_name)
        start = time.monotonic_ns()
        try:
            await self.manager.demand.wait(request.model_name, request)  # type: ignore[union-attr]
        finally:
            self.admission.release(nbytes)
            request.load_wait_ns = time.monotonic_ns() - start

    async def _loaded(self, name: str) -> None:
        """on_demand: metadata and config of a model that is not loaded load it, as a request would."""
        demand = self.manager.demand
        if demand is not None and demand.cold(name):
            await demand.wait(name)

    def _answered(self, nbytes: int, on_done: Callable[[ModelRun], None], run: ModelRun) -> None:
        self.admission.release(nbytes)
        if run.request.dispatched and self._shedding_on and not run.request.background:
            self._observe(run.model, run.request)
        on_done(run)

    def queue_delay(self, model: str) -> QueueDelay:
        """The queue-delay controller of the model named ``model`` (made on first use)."""
        delay = self._delays.get(model)
        if delay is None:
            delay = self._delays[model] = self.shedding.fresh()
        return delay

    def _observe(self, model: Model, request: InferenceRequest) -> None:
        """A request its scheduler handed to an instance has ended (shedding on): its queueing delay,
        from its frontend receiving it to that hand-over, feeds its model's controller, whose target
        follows the model's mean execution. A delay that leaves the controller as it is (the common
        case: well under target, no overload building) is not fed, nor the target followed. A
        batch line's (``request.background``) is never fed: it waits for idle capacity on purpose."""
        delay = self._delays.get(model.spec.name) or self.queue_delay(model.spec.name)
        received = (request.received_ns + request.load_wait_ns) * 1e-9 if request.received_ns else request.dispatched
        waited = request.dispatched - received
        if delay.settled(waited):
            return
        infer = model.stats.compute_infer
        if infer.count:
            delay.follow(infer.ns / infer.count * 1e-9)
        delay.observe(waited, self.clock.now())

    def _shed(self, delay: QueueDelay, request: InferenceRequest) -> None:
        """While ``request``'s model sheds (``delay`` is dropping): refuse a request that already waited
        past its target since its frontend received it (before it costs anything more), and bound the
        wait of one admitted."""
        now = self.clock.now()
        received = min((request.received_ns + request.load_wait_ns) * 1e-9, now) if request.received_ns else now
        refused = delay.refusal(request.model_name, now - received, now)
        if refused is not None:
            raise refused
        request.shed_at = delay.shed_at(received)

    def _admit(self, request: InferenceRequest, decoupled_error: str,
               trace_carrier: TraceCarrier | None) -> tuple[Model, int]:
        """Refuse while draining or full, resolve shared memory, start the trace, find the model,
        shed while it is overloaded: the model and the bytes admitted, which the caller releases
        once the request has ended. One step, on every request: the lookup (as
        :func:`~inferd.model.dispatch.find`, a decoupled model refused) and the shedding test are
        written out here."""
        if self.draining:
            raise Draining(DRAINING)
        if request.deadline is not None and request.deadline <= self.clock.now():
            raise DeadlineExceeded(_PASSED.format(model=request.model_name,
                                                  us=round((self.clock.now() - request.deadline) * 1e6)))
        nbytes = request_bytes(request.inputs)
        admission = self.admission
        admission.admit(nbytes, request.model_name)  # raises Unavailable when the server is full
        try:
            if request.shared_memory:
                self.shared_memory.resolve(request)
            if self.tracing.enabled and request.trace is None:
                request.trace = self.tracing.start(request.model_name, request.id, trace_carrier, request.model_version)
                if request.trace is not None and request.frontend is not None:
                    request.trace.frontend(request.frontend)  # its span waits for the frontend's send
            try:
                model = self.manager.get(request.model_name, request.model_version)
                if model.decoupled:
                    raise Unimplemented(decoupled_error)
                delay = self._delays.get(model.spec.name)
                if delay is not None and delay.dropping:
                    self._shed(delay, request)
            except InferdError as exc:
                if request.trace is not None:
                    request.trace.end(exc)
                raise
            return model, nbytes
        except BaseException:
            admission.release(nbytes)
            raise

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        nbytes = request_bytes(request.inputs)
        try:
            if self.draining:
                raise Draining(DRAINING)
            self.admission.admit(nbytes, request.model_name)
        except InferdError as exc:
            yield StreamResponse(error=exc, final=True)
            return
        try:
            if request.shared_memory:
                self.shared_memory.resolve(request)
        except InferdError as exc:
            self.admission.release(nbytes)
            yield StreamResponse(error=exc, final=True)
            return
        demand = self.manager.demand
        if demand is not None and demand.cold(request.model_name):
            start = time.monotonic_ns()
            try:
                await demand.wait(request.model_name, request)
                request.load_wait_ns = time.monotonic_ns() - start
            except InferdError as exc:
                self.admission.release(nbytes)
                yield StreamResponse(error=exc, final=True)
                return
            except BaseException:
                self.admission.release(nbytes)
                raise
        try:
            async with aclosing(model_infer_stream(self.manager.get, request, self.clock, self.stream_limits)) as items:
                if request.openai_prompt_tokens is None:
                    async for item in items:
                        yield item
                else:
                    async for item in _count_tokens(self.manager, request, items):
                        yield item
        finally:
            self.admission.release(nbytes)


    # -- batch jobs ------------------------------------------------------------------

    def _batch_service(self) -> BatchService:
        if self.batches is None:
            raise Unimplemented("batch jobs are off in this server (it has no batch directory)")
        return self.batches

    async def batch_submit(self, data: bytes, model: str, version: int = 0) -> dict[str, Any]:
        if self.draining:
            raise Draining(DRAINING)
        return await self._batch_service().submit(data, model, version)

    async def batch_list(self) -> list[dict[str, Any]]:
        return self._batch_service().all()

    async def batch_status(self, job_id: str) -> dict[str, Any]:
        return self._batch_service().status(job_id)

    async def batch_cancel(self, job_id: str) -> dict[str, Any]:
        return await self._batch_service().cancel(job_id)

    async def batch_results(self, job_id: str, fmt: str = "jsonl") -> bytes:
        return self._batch_service().results(job_id, fmt)

    # -- OpenAI's Batch API (OpenAIBatchAPI: the /v1 routes, from any frontend worker) -----------------

    def _openai_batches(self) -> OpenAIBatches:
        if self.batches is None or self.batches.openai is None:
            raise Unimplemented("the Batch API (/v1/files, /v1/batches) is off in this server (it has no batch "
                                "directory)")
        return self.batches.openai

    async def openai_file_create(self, filename: str, purpose: str, upload: str) -> dict[str, Any]:
        return self._openai_batches().create_file(filename, purpose, upload)

    async def openai_file(self, file_id: str) -> dict[str, Any]:
        return self._openai_batches().file(file_id)

    async def openai_files(self, purpose: str | None) -> dict[str, Any]:
        return self._openai_batches().list_files(purpose)

    async def openai_file_delete(self, file_id: str) -> dict[str, Any]:
        return self._openai_batches().delete_file(file_id)

    async def openai_file_content(self, file_id: str) -> str:
        return str(self._openai_batches().content(file_id))

    async def openai_batch_create(self, input_file_id: str, endpoint: str,
                                  metadata: dict[str, str] | None) -> dict[str, Any]:
        if self.draining:
            raise Draining(DRAINING)
        return self._openai_batches().create_batch(input_file_id, endpoint, metadata)

    async def openai_batch(self, batch_id: str) -> dict[str, Any]:
        return self._openai_batches().batch(batch_id)

    async def openai_batches(self, after: str | None, limit: int) -> dict[str, Any]:
        return self._openai_batches().list_batches(after, limit)

    async def openai_batch_cancel(self, batch_id: str) -> dict[str, Any]:
        return await self._openai_batches().cancel(batch_id)


def _check_repository(repository: str, name: str) -> None:
    # One namespace over every --model-repository, as Triton without named repositories.
    if repository:
        raise InvalidArgument(f"model '{name}': repository_name '{repository}': named repositories are not "
                              "supported; leave it empty")


def _platform(model: Model) -> str:
    # Triton reports the platform for ONNX/TorchScript/ensembles, and the
    # backend's name for backend-only models such as python.
    return model.spec.platform or model.spec.backend


async def _count_tokens(manager: ModelManager, request: InferenceRequest,
                        items: AsyncIterator[StreamResponse]) -> AsyncIterator[StreamResponse]:
    """A /v1 request's stream, its tokens counted in its model version's stats for /metrics: the prompt's
    (which only the /v1 layer sets on a request) at its first response, and one per response carrying the
    model's text output, as the /v1 layer's usage counts them. A request refused before any response
    counts nothing."""
    stats = None
    output = ""
    async for item in items:
        response = item.response
        if response is not None:
            if stats is None:
                try:
                    model = manager.get(response.model_name, response.model_version)
                except InferdError:  # unloaded meanwhile: its series are gone with it
                    model = None
                if model is not None and model.spec.openai is not None:
                    stats, output = model.stats, model.spec.openai.text_output
                    stats.prompt_tokens += request.openai_prompt_tokens or 0
            if stats is not None and output in response.outputs:
                stats.completion_tokens += 1
        yield item
