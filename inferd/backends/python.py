"""The Python backend (backend ``python``): Triton Python models, in-process.

A model is a ``model.py`` defining ``TritonPythonModel`` exactly as Triton's
python backend expects it (``import triton_python_backend_utils as pb_utils``
works, see that package):

- ``auto_complete_config(auto_complete_model_config)`` (optional, static):
  called when the model is prepared, before validation; it may add inputs and
  outputs, set max_batch_size and turn on dynamic batching;
- ``initialize(args)`` (optional): once per instance, with Triton's args
  (``model_config`` as a JSON string, ``model_instance_kind``,
  ``model_instance_name``, ``model_instance_device_id``, ``model_repository``
  (the model's folder), ``model_version``, ``model_name``);
- ``execute(requests)``: the whole dynamic batch, one ``InferenceResponse``
  per request; may be ``async def`` (it then runs on an event loop of the
  instance's own, in its worker thread, where ``async_exec`` BLS calls can be
  awaited together);
- ``finalize()`` (optional): at unload.

A decoupled model (``model_transaction_policy { decoupled: true }``) returns
None from ``execute`` and answers each request through
``request.get_response_sender()``: any number of responses, from any thread,
even after ``execute`` returned, then the final flag. They go to the
request's :class:`~inferd.streaming.ResponseSink` (streamed to the client as
sent); ``execute`` raising ends every request still open with its error.
Such a model can only be reached through a stream (ModelStreamInfer).

An iterative sequence model (``sequence_batching { iterative_sequence: true }``)
is stepped by :mod:`inferd.scheduling.iterative`: a request its ``execute``
releases with ``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``
runs again at the next step (reported in ``BatchResult.reschedule``; a model
that is not decoupled returns None for it, as Triton requires). Any other
model that reschedules gets Triton's error for that request.

A sequence model (``sequence_batching``) sees each request's
``correlation_id()`` and ``flags()`` (START 1, END 2) and its control and
state inputs as input tensors; its state outputs are read back by the batcher.

Where Triton runs each instance in a stub process, inferd runs it in the
server process on the instance's worker thread. Each instance imports its
``model.py`` as a module of its own (a unique name per model, version and
instance), so two models' ``model.py`` never clash and module-level state is
per instance, as with Triton's processes. The version folder is put on
``sys.path`` so a model can import files next to it (shared by the process:
two models with sibling modules of the same name share the first one loaded).

User code may block, or wait on other models (BLS), so a Python instance
always executes on its thread, never inline on the event loop
(``inferd.execution: inline`` is refused). An exception from ``execute``
fails the requests of that execution; an error response fails its request
only; both reach the client as INTERNAL with the model named (or the status
of the ``TritonError`` code the model chose).

BLS: ``pb_utils.InferenceRequest(...).exec()`` submits the request to the
instance's :class:`~inferd.backends.base.InferenceDispatcher` (handed to it in
its ``InstanceSpec``) on the server's event loop
(``asyncio.run_coroutine_threadsafe``) and waits; the callee schedules it with
the rest of its traffic. The instance makes its dispatcher the one of the
thread while its code runs there, and puts it in its own module for threads
the model starts itself; outside a server there is none.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import triton_python_backend_utils as pb_utils
from inferd.backends.base import (
    Backend, BatchResult, ExecutionTimes, InferenceDispatcher, InstanceSpec, ModelInstance, RequestInputs,
    resident_bytes,
)
from inferd.config import ModelConfig, ModelSpec, config_from_dict, message_to_dict
from inferd.errors import (
    AlreadyExists, Cancelled, ConfigError, InferdError, InvalidArgument, ModelExecutionError, NotFound,
    Unavailable, Unimplemented,
)
from inferd.gpu.inventory import default_inventory
from inferd.observability.tracing import bls_call
from inferd.streaming import ResponseSink, StreamEvent
from inferd.types import InferenceRequest, RequestedOutput

log = logging.getLogger(__name__)

_module_ids = itertools.count(1)
_path_lock = threading.Lock()


# -- the model's module ---------------------------------------------------------------


def _load_module(model: str, path: Path, tag: str) -> Any:
    """Import ``path`` as a fresh module of its own; ConfigError if it fails."""
    safe = re.sub(r"\W", "_", f"{model}_{tag}")
    unique = f"_inferd_python_model_{safe}_{next(_module_ids)}"
    folder = str(path.parent)
    with _path_lock:
        if folder not in sys.path:
            sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model '{model}': cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(unique, None)
        raise ConfigError(f"model '{model}': importing {path} failed: {type(exc).__name__}: {exc}") from None
    return module


def _unload_module(module: Any) -> None:
    sys.modules.pop(getattr(module, "__name__", ""), None)


def _model_class(model: str, module: Any, path: Path) -> Any:
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None or not isinstance(cls, type):
        raise ConfigError(f"model '{model}': {path} defines no class TritonPythonModel")
    if not callable(getattr(cls, "execute", None)):
        raise ConfigError(f"model '{model}': TritonPythonModel in {path} has no execute(self, requests) method")
    return cls


# CPython 3.11 keeps ast.parse's recursion count in the interpreter, not the thread: two parses at
# once on two threads (two Python models prepared side by side) can fail one with "SystemError: AST
# constructor recursion depth mismatch" (CPython gh-106905; a make test here did). One at a time.
_PARSE = threading.Lock()


def _plainly_without_auto_complete(path: Path) -> bool:
    """Whether the file's own text shows a model with nothing to auto-complete: it parses, defines a
    ``TritonPythonModel`` class with no base class and an ``execute``, and never names
    ``auto_complete_config``. Such a model's config needs no import of it: its imports (torch, for
    one: seconds, and hundreds of MiB kept) then happen only where its instances run, in their model
    hosts. Anything else (a base class, a syntax error, no such class) is imported as before, which
    completes the config or names what is wrong."""
    try:
        source = path.read_text()
        with _PARSE:
            tree = ast.parse(source, str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    if "auto_complete_config" in source:
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel":
            return not node.bases and not node.keywords and any(
                isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "execute" for f in node.body)
    return False


# -- the config as Triton's JSON ------------------------------------------------------

# -- the backend ---------------------------------------------------------------------------


class PythonBackend(Backend):
    name = "python"
    platform = ""  # Triton's python models name a backend, not a platform
    default_filename = "model.py"
    file_suffixes = (".py",)
    # The model's own code answers each request (decoupled: as many responses as it sends),
    # reads whatever inputs a request sends, sees each request's own tensors (no joined batch),
    # and ends an iterative sequence by releasing its request without RESCHEDULE.
    decoupled = True
    undeclared_inputs = True
    joins_batches = False
    ends_sequences_by_release = True
    gpu_requirement = "this torch has no CUDA"

    def __init__(self) -> None:
        self._gpu: bool | None = None

    def gpu_available(self) -> bool:
        # Decides KIND_AUTO (and lets KIND_GPU load): a Python model runs on the
        # CPU itself and uses a GPU through its own libraries. Only a host with
        # an NVIDIA driver is asked through torch, which is slow to import.
        if self._gpu is None:
            self._gpu = bool(default_inventory().gpus())
        return self._gpu

    def complete_config(self, config: ModelConfig, model_file: Path) -> None:
        name = config.name
        if _plainly_without_auto_complete(model_file):
            return
        module = _load_module(name, model_file, "autocomplete")
        try:
            cls = _model_class(name, module, model_file)
            complete = getattr(cls, "auto_complete_config", None)
            if complete is None:
                return
            holder = pb_utils.ModelConfig(message_to_dict(config))
            _enter(name, None, str(model_file.parent))
            try:
                result = complete(holder)
            except Exception as exc:
                raise ConfigError(
                    f"model '{name}': auto_complete_config failed: {type(exc).__name__}: {exc}"
                ) from None
            finally:
                _leave()
            completed = (result if result is not None else holder).as_dict()
            try:
                fresh = config_from_dict(completed)
            except ValueError as exc:
                raise ConfigError(
                    f"model '{name}': auto_complete_config produced an invalid config: {exc}"
                ) from None
            config.CopyFrom(fresh)
        finally:
            _unload_module(module)

    def create_instance(self, spec: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        return PythonInstance(self, spec, instance)

    def ignored_optimizations(self, spec: ModelSpec, kinds: set[str]) -> list[tuple[str, str]]:
        why = "a Python model runs its own code, which may read the setting from args['model_config']"
        return [(field, why) for field in spec.optimization.requested()]


class PythonInstance(ModelInstance):
    wants_requests = True
    thread_only = True

    def __init__(self, backend: PythonBackend, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        name = spec.name
        if spec.params.execution == "inline":
            raise ConfigError(
                f"model '{name}': parameter 'inferd.execution' is 'inline', but Python models always run on their "
                "instance's thread (user code may block or call other models)"
            )
        path = instance.model_file
        self._dispatcher = instance.dispatcher
        self._model_dir = str(path.parent)  # pb_utils.get_model_dir()
        self._module = _load_module(name, path, f"v{instance.version}_{instance.name}")
        # For BLS calls from threads the model starts itself (its own code's module is known there).
        self._module.__dict__[_DISPATCHER] = self._dispatcher
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            cls = _model_class(name, self._module, path)
            self._model = cls()
            self._execute = self._model.execute
            args = {
                "model_config": json.dumps(spec.config_dict()),
                "model_instance_kind": "GPU" if instance.device.kind == "cuda" else "CPU",
                "model_instance_name": instance.name,
                "model_instance_device_id": str(instance.device.index),
                "model_repository": str(instance.model_dir),
                "model_version": str(instance.version),
                "model_name": name,
            }
            initialize = getattr(self._model, "initialize", None)
            if initialize is not None:
                _enter(name, self._dispatcher, self._model_dir)
                try:
                    done = initialize(args)
                    if inspect.isawaitable(done):
                        self._run_async(done)
                except Exception as exc:
                    raise ModelExecutionError(
                        f"model '{name}': TritonPythonModel.initialize failed: {type(exc).__name__}: {exc}"
                    ) from None
                finally:
                    _leave()
        except BaseException:
            self._release()
            raise
        outputs = list(spec.outputs)
        self._all_outputs = outputs
        # A sequence model's state outputs are read back by the sequence batcher.
        self._known_outputs = set(outputs) | {s.output for s in (spec.sequence.states if spec.sequence else ())}
        self._decoupled = spec.decoupled
        # iterative_sequence: a request released with RESCHEDULE runs again at the next step.
        self._iterative = bool(spec.sequence is not None and spec.sequence.iterative)
        self._warned_return = False
        if callable(getattr(self._model, "is_ready", None)):
            self.ready_check = self._user_ready

    def _user_ready(self) -> bool:
        """The model's ``is_ready()`` (sync or ``async def``), on a thread of the server's pool: it may
        run while ``execute`` does, as in Triton's stub. An ``async def`` one runs on a loop of its own
        (the instance's loop may be busy executing). Anything but True or False is not ready."""
        name = self.model.name
        _enter(name, self._dispatcher, self._model_dir)
        try:
            answer = self._model.is_ready()
            if inspect.isawaitable(answer):
                answer = asyncio.run(_awaited(answer))
        finally:
            _leave()
        if not isinstance(answer, (bool, np.bool_)):
            raise ModelExecutionError(
                f"model '{name}': TritonPythonModel.is_ready must return a bool, got {type(answer).__name__}")
        return bool(answer)

    # -- execution -------------------------------------------------------------------

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        if self._decoupled:
            return self._execute_decoupled(inputs)
        name = self.model.name
        times = ExecutionTimes()
        t0 = time.perf_counter_ns()
        requests = [self._request(item) for item in inputs]
        t1 = time.perf_counter_ns()
        rss = resident_bytes()  # the model's own code is measured: what it keeps shows as growth
        _enter(name, self._dispatcher, self._model_dir)
        try:
            responses = self._execute(requests)
            if inspect.isawaitable(responses):
                responses = self._run_async(responses)
        except Exception as exc:
            log.error("model '%s': execute raised", name, exc_info=True)
            error = ModelExecutionError(f"model '{name}' failed to execute: {type(exc).__name__}: {exc}")
            times.infer_ns = time.perf_counter_ns() - t1
            times.input_ns = t1 - t0
            return BatchResult([error] * len(inputs), times, memory_delta=resident_bytes() - rss)
        finally:
            _leave()
        grown = resident_bytes() - rss
        t2 = time.perf_counter_ns()
        again = self._rescheduled(requests)
        results = self._results(requests, responses, again)
        times.input_ns = t1 - t0
        times.infer_ns = t2 - t1
        times.output_ns = time.perf_counter_ns() - t2
        return BatchResult(results, times, memory_delta=grown,
                           reschedule=again if self._iterative and any(again) else None)

    def _rescheduled(self, requests: list[pb_utils.InferenceRequest]) -> list[bool]:
        """Which requests the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE."""
        return [r.release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE for r in requests]

    def _reschedule_refused(self) -> InvalidArgument:
        # Triton's words (clients match on them), then what would make it valid.
        return InvalidArgument(
            f"model '{self.model.name}': Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while "
            "the model is not configured to handle such a flag (it needs sequence_batching "
            "{ iterative_sequence: true })")

    def _request(self, item: dict[str, np.ndarray]) -> pb_utils.InferenceRequest:
        tensors = [pb_utils.Tensor._of_request(n, a) for n, a in item.items()]
        source = item.request if isinstance(item, RequestInputs) else None
        if source is None:
            return pb_utils.InferenceRequest._of_server(tensors, "", list(self._all_outputs), {}, None)
        requested = source.requested_outputs
        names = [r.name for r in requested] if requested else list(self._all_outputs)
        return pb_utils.InferenceRequest._of_server(tensors, source.id, names, source.parameters, source)

    def _results(self, requests: list[pb_utils.InferenceRequest], responses: Any,
                 again: list[bool]) -> list[dict[str, np.ndarray] | InferdError]:
        name = self.model.name
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = f"{len(responses)} responses" if isinstance(responses, (list, tuple)) else type(responses).__name__
            error = ModelExecutionError(
                f"model '{name}': execute() must return a list of one InferenceResponse per request; "
                f"it got {len(requests)} request(s) and returned {got}"
            )
            return [error] * len(requests)
        results: list[dict[str, np.ndarray] | InferdError] = []
        for i, (request, response) in enumerate(zip(requests, responses)):
            if not again[i]:
                results.append(self._convert(i, request, response))
            elif not self._iterative:
                results.append(self._reschedule_refused())
            elif response is not None:  # Triton's rule: a rescheduled request answers later
                results.append(ModelExecutionError(
                    f"model '{name}': execute() returned {type(response).__name__} for request {i}, which it "
                    "rescheduled; expected None (a rescheduled request is answered when its sequence ends)"))
            else:
                results.append({})
        return results

    def _convert(self, i: int, request: pb_utils.InferenceRequest, response: Any) -> dict[str, np.ndarray] | InferdError:
        """One response of the model: its outputs, or the error it carries."""
        name = self.model.name
        if not isinstance(response, pb_utils.InferenceResponse):
            return ModelExecutionError(
                f"model '{name}': execute() returned {type(response).__name__} for request {i}; "
                "expected pb_utils.InferenceResponse"
            )
        error = response.error()
        if error is not None:
            return _error_from_triton(f"model '{name}': ", error)
        outputs: dict[str, np.ndarray] = {}
        for tensor in response.output_tensors():
            if not isinstance(tensor, pb_utils.Tensor):
                return ModelExecutionError(
                    f"model '{name}': the response to request {i} holds {type(tensor).__name__}, not pb_utils.Tensor"
                )
            if tensor.name() in self._known_outputs:
                outputs[tensor.name()] = tensor._array
        missing = [n for n in request.requested_output_names() if n not in outputs]
        if missing:
            return ModelExecutionError(
                f"model '{name}': the response to request {i} has no output {', '.join(map(repr, missing))} "
                f"(it has {sorted(t.name() for t in response.output_tensors())})"
            )
        return outputs

    # -- decoupled models ------------------------------------------------------------------

    def _execute_decoupled(self, inputs: Sequence[dict[str, np.ndarray]]) -> BatchResult:
        """Hand the requests, each with a response sender, to the model. The
        result only says which requests reached it; responses go to the sinks."""
        name = self.model.name
        times = ExecutionTimes()
        t0 = time.perf_counter_ns()
        results: list[dict[str, np.ndarray] | InferdError] = [{} for _ in inputs]
        requests: list[pb_utils.InferenceRequest] = []
        senders: list[tuple[pb_utils.InferenceResponseSender, ResponseSink | None]] = []
        reached: list[int] = []  # the row of each request handed to the model
        for i, item in enumerate(inputs):
            source = item.request if isinstance(item, RequestInputs) else None
            sink = source.responder if source is not None else None
            if source is not None and sink is None:
                results[i] = Unimplemented(
                    f"model '{name}' is decoupled (model_transaction_policy.decoupled): its responses can only "
                    "be streamed to a client (ModelStreamInfer), not returned to this caller"
                )
                continue
            request = self._request(item)
            sender = pb_utils.InferenceResponseSender(self._deliverer(request, sink), request,
                                                      getattr(sink, "refused", None))
            request._sender = sender
            requests.append(request)
            senders.append((sender, sink))
            reached.append(i)
        t1 = time.perf_counter_ns()
        for _, sink in senders:
            if isinstance(sink, ResponseSink) and not sink.started_ns:
                sink.started_ns = t1  # its first response's statistics count from here
        if requests:
            _enter(name, self._dispatcher, self._model_dir)
            for sender, _ in senders:
                sender._in_execute = True
            try:
                returned = self._execute(requests)
                if inspect.isawaitable(returned):
                    returned = self._run_async(returned)
                if returned is not None and not self._warned_return:
                    self._warned_return = True
                    log.warning("model '%s' is decoupled: execute() should return None; what it returned "
                                "is ignored (responses go through request.get_response_sender())", name)
            except Exception as exc:
                log.error("model '%s': execute raised", name, exc_info=True)
                error = ModelExecutionError(f"model '{name}' failed to execute: {type(exc).__name__}: {exc}")
                for sender, sink in senders:
                    if sender._close() and sink is not None:
                        sink.put(StreamEvent(error=error, final=True))
                requests = []  # none of them goes on
            finally:
                for sender, _ in senders:
                    sender._in_execute = False
                _leave()
        times.input_ns = t1 - t0
        times.infer_ns = time.perf_counter_ns() - t1
        again = [False] * len(inputs)
        for index, request, (sender, sink) in zip(reached, requests, senders):
            if request.release_flags() != pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                continue
            if self._iterative:
                again[index] = True
            elif sender._close() and sink is not None:
                sink.put(StreamEvent(error=self._reschedule_refused(), final=True))
        return BatchResult(results, times, reschedule=again if any(again) else None)

    def _deliverer(self, request: pb_utils.InferenceRequest, sink: ResponseSink | None) -> Any:
        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if sink is None:  # a filler row of a sequence batch: nobody asked
                return
            if response is None:
                sink.put(StreamEvent(final=True))
                return
            out = self._convert(0, request, response)
            if isinstance(out, InferdError):
                sink.put(StreamEvent(error=out, final=final))
            else:
                # Copied now: the model may reuse its arrays before the loop encodes them.
                sink.put(StreamEvent(outputs={k: np.array(v, copy=True) for k, v in out.items()}, final=final))

        return deliver

    def _run_async(self, awaitable: Any) -> Any:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.new_event_loop()
        return loop.run_until_complete(_as_coroutine(awaitable))

    # -- unload --------------------------------------------------------------------------

    def close(self) -> None:
        finalize = getattr(getattr(self, "_model", None), "finalize", None)
        if finalize is not None:
            _enter(self.model.name, self._dispatcher, self._model_dir)
            try:
                done = finalize()
                if inspect.isawaitable(done):
                    self._run_async(done)
            except Exception:
                log.exception("model '%s': TritonPythonModel.finalize raised", self.model.name)
            finally:
                _leave()
        self._release()

    def _release(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        _unload_module(self._module)


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


_STATUS_BY_CODE = {
    pb_utils.TritonError.NOT_FOUND: NotFound,
    pb_utils.TritonError.INVALID_ARG: InvalidArgument,
    pb_utils.TritonError.UNAVAILABLE: Unavailable,
    pb_utils.TritonError.UNSUPPORTED: Unimplemented,
    pb_utils.TritonError.ALREADY_EXISTS: AlreadyExists,
    pb_utils.TritonError.CANCELLED: Cancelled,
}
_CODE_BY_STATUS = [(cls, code) for code, cls in _STATUS_BY_CODE.items()]


def _error_from_triton(prefix: str, error: pb_utils.TritonError) -> InferdError:
    code = error.code() if callable(getattr(error, "code", None)) else pb_utils.TritonError.INTERNAL
    cls = _STATUS_BY_CODE.get(code, ModelExecutionError)
    return cls(f"{prefix}{error.message()}")


def _triton_error(exc: BaseException) -> pb_utils.TritonError:
    if isinstance(exc, InferdError):
        for cls, code in _CODE_BY_STATUS:
            if isinstance(exc, cls):
                return pb_utils.TritonError(exc.message, code)
        return pb_utils.TritonError(exc.message, pb_utils.TritonError.INTERNAL)
    return pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


# -- BLS -----------------------------------------------------------------------------------


_DISPATCHER = "__inferd_dispatcher__"  # in each instance's module: its dispatcher
_running = threading.local()  # the dispatcher of the instance whose code runs on this thread


def _enter(model: str, dispatcher: InferenceDispatcher | None, model_dir: str | None = None) -> None:
    """The instance's user code starts running on this thread (model name for pb_utils.Logger,
    its folder for pb_utils.get_model_dir, BLS target)."""
    pb_utils._set_current_model(model, model_dir)
    _running.dispatcher = dispatcher


def _leave() -> None:
    pb_utils._set_current_model(None)
    _running.dispatcher = None


def _dispatcher(caller_globals: dict[str, Any]) -> InferenceDispatcher | None:
    """The dispatcher of the instance making a BLS call: the one whose code runs on this
    thread, else (a thread the model started) the one whose module holds the calling code."""
    return getattr(_running, "dispatcher", None) or caller_globals.get(_DISPATCHER)


def _internal_request(request: pb_utils.InferenceRequest) -> InferenceRequest:
    if not request.model_name:
        raise InvalidArgument("BLS request: model_name is required")
    inputs: dict[str, np.ndarray] = {}
    for tensor in request.inputs():
        if not isinstance(tensor, pb_utils.Tensor):
            raise InvalidArgument(
                f"BLS request to model '{request.model_name}': inputs must be pb_utils.Tensor, "
                f"got {type(tensor).__name__}"
            )
        array = tensor._array
        if array.dtype.kind == "S":  # BYTES travel as object arrays of bytes
            array = array.astype(np.object_)
        if tensor.name() in inputs:
            raise InvalidArgument(f"BLS request to model '{request.model_name}': input '{tensor.name()}' is given twice")
        inputs[tensor.name()] = array
    version = request.model_version
    requested = request.requested_output_names()
    parameters = dict(request._parameters)
    # A stateful callee (BLS with sequences): correlation id and flags travel as a client's
    # sequence parameters do, which the sequence batcher reads.
    if request.correlation_id():
        parameters.setdefault("sequence_id", request.correlation_id())
    if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters.setdefault("sequence_start", True)
    if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters.setdefault("sequence_end", True)
    return InferenceRequest(
        model_name=request.model_name,
        inputs=inputs,
        model_version=version if version and version > 0 else 0,
        id=request.request_id(),
        requested_outputs=[RequestedOutput(n) for n in requested] if requested else None,
        parameters=parameters,
        priority=int(parameters.get("priority", 0) or 0),
        timeout_us=int(request.timeout() or 0),
        # trace=request.trace(): the call is a child of the calling request's trace (ended by its model path).
        trace=bls_call(request.trace()._trace, request.model_name, version or 0),
    )


async def _bls_call(dispatcher: InferenceDispatcher, request: InferenceRequest) -> pb_utils.InferenceResponse:
    try:
        response = await dispatcher.infer(request)
    except Exception as exc:
        return pb_utils.InferenceResponse(error=_triton_error(exc))
    tensors = [pb_utils.Tensor(name, array) for name, array in response.outputs.items()]
    return pb_utils.InferenceResponse(output_tensors=tensors, parameters=response.parameters)


def _prepare(request: pb_utils.InferenceRequest, server: InferenceDispatcher | None,
             ) -> tuple[Any, InferenceRequest | pb_utils.InferenceResponse]:
    if server is None or server.loop is None:
        return None, pb_utils.InferenceResponse(error=pb_utils.TritonError(
            "BLS needs a running inferd server; there is none in this process", pb_utils.TritonError.UNAVAILABLE))
    try:
        return server, _internal_request(request)
    except InferdError as exc:
        return server, pb_utils.InferenceResponse(error=_triton_error(exc))


def _on_server_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def bls_exec(request: pb_utils.InferenceRequest, caller_globals: dict[str, Any]) -> pb_utils.InferenceResponse:
    """``InferenceRequest.exec()``: run on the server's loop, wait on this thread.
    ``caller_globals``: the calling code's module globals (see :func:`_dispatcher`)."""
    server, prepared = _prepare(request, _dispatcher(caller_globals))
    if isinstance(prepared, pb_utils.InferenceResponse):
        return prepared
    if _on_server_loop(server.loop):
        raise pb_utils.TritonModelException(
            "InferenceRequest.exec() was called on the server's event loop, where waiting would deadlock"
        )
    try:
        future = asyncio.run_coroutine_threadsafe(_bls_call(server, prepared), server.loop)
    except RuntimeError as exc:  # the loop is closed: the server stopped
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(
            f"BLS request to model '{request.model_name}': the server is stopping ({exc})",
            pb_utils.TritonError.UNAVAILABLE))
    try:
        return future.result()
    except BaseException as exc:  # cancelled when the server's loop shuts down under us
        if not isinstance(exc, (Exception, asyncio.CancelledError)):
            raise
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(
            f"BLS request to model '{request.model_name}' did not complete: {type(exc).__name__}: {exc}",
            pb_utils.TritonError.UNAVAILABLE))


def bls_async_exec(request: pb_utils.InferenceRequest, caller_globals: dict[str, Any]) -> Any:
    """``InferenceRequest.async_exec()``: an awaitable on the caller's running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise pb_utils.TritonModelException(
            "InferenceRequest.async_exec() must be awaited inside 'async def execute'; use exec() in a plain execute"
        ) from None
    server, prepared = _prepare(request, _dispatcher(caller_globals))
    done: asyncio.Future = loop.create_future()
    if isinstance(prepared, pb_utils.InferenceResponse):
        done.set_result(prepared)
        return done
    if server.loop is loop:
        return loop.create_task(_bls_call(server, prepared))
    try:
        future = asyncio.run_coroutine_threadsafe(_bls_call(server, prepared), server.loop)
    except RuntimeError as exc:
        done.set_result(pb_utils.InferenceResponse(error=pb_utils.TritonError(
            f"BLS request to model '{request.model_name}': the server is stopping ({exc})",
            pb_utils.TritonError.UNAVAILABLE)))
        return done
    return asyncio.wrap_future(future, loop=loop)


# -- BLS into a decoupled model (exec / async_exec with decoupled=True) -------------------

# Responses a BLS caller may leave unread before the callee's stream waits (then its sink's
# own limit holds the model back): a model that never reads cannot grow the server.
BLS_STREAM_WINDOW = 16


def _stream_item(item: Any) -> pb_utils.InferenceResponse:
    """One StreamResponse as the caller's pb_utils.InferenceResponse (the final marker alone: empty)."""
    if item.error is not None:
        return pb_utils.InferenceResponse(error=_triton_error(item.error))
    if item.response is None:
        return pb_utils.InferenceResponse()
    tensors = [pb_utils.Tensor(name, array) for name, array in item.response.outputs.items()]
    return pb_utils.InferenceResponse(output_tensors=tensors, parameters=item.response.parameters)


async def _bls_stream(server: InferenceDispatcher, request: InferenceRequest, feed: Any) -> None:
    """Feed an iterator (its ``_Feed``) from the callee's stream, on the server's loop; ends it
    on every path. Holds the feed only: an iterator the model drops is collected and cancels this."""
    loop = asyncio.get_running_loop()
    credit = asyncio.Semaphore(BLS_STREAM_WINDOW)
    feed.credit = lambda: loop.call_soon_threadsafe(credit.release)
    final = False
    try:
        stream = server.infer_stream(request)
        try:
            async for item in stream:
                await credit.acquire()
                feed.put(_stream_item(item))
                if item.final:
                    final = True
                    break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
    except asyncio.CancelledError:
        if not final:
            feed.put(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"BLS request to model '{request.model_name}' was cancelled", pb_utils.TritonError.CANCELLED)))
            final = True
    except Exception as exc:  # a bug below: the caller still gets an answer
        log.exception("BLS stream to model '%s' failed", request.model_name)
        feed.put(pb_utils.InferenceResponse(error=_triton_error(exc)))
        final = True
    finally:
        if not final:
            feed.put(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"BLS request to model '{request.model_name}' ended without a final response",
                pb_utils.TritonError.INTERNAL)))
        feed.end()


def _start_stream(request: pb_utils.InferenceRequest, caller_globals: dict[str, Any]) -> pb_utils.ResponseIterator:
    it = pb_utils.ResponseIterator()
    feed = it._feed
    server, prepared = _prepare(request, _dispatcher(caller_globals))
    if isinstance(prepared, pb_utils.InferenceResponse):
        feed.put(prepared)
        feed.end()
        return it
    try:
        future = asyncio.run_coroutine_threadsafe(_bls_stream(server, prepared, feed), server.loop)
    except RuntimeError as exc:  # the loop is closed: the server stopped
        feed.put(pb_utils.InferenceResponse(error=pb_utils.TritonError(
            f"BLS request to model '{request.model_name}': the server is stopping ({exc})",
            pb_utils.TritonError.UNAVAILABLE)))
        feed.end()
        return it
    loop = server.loop

    def cancel() -> None:
        if not future.done():
            try:
                loop.call_soon_threadsafe(future.cancel)
            except RuntimeError:  # the server's loop is closed: nothing left to cancel
                pass

    it._on_cancel(cancel)
    return it
def bls_stream(request: pb_utils.InferenceRequest, caller_globals: dict[str, Any]) -> pb_utils.ResponseIterator:
    """``InferenceRequest.exec(decoupled=True)``: the callee's responses, read on this thread."""
    server = _dispatcher(caller_globals)
    if server is not None and server.loop is not None and _on_server_loop(server.loop):
        raise pb_utils.TritonModelException(
            "InferenceRequest.exec(decoupled=True) was called on the server's event loop, where waiting would deadlock"
        )
    return _start_stream(request, caller_globals)


def bls_async_stream(request: pb_utils.InferenceRequest, caller_globals: dict[str, Any]) -> Any:
    """``InferenceRequest.async_exec(decoupled=True)``: an awaitable for the iterator, done
    once its first response (or its end) is there."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise pb_utils.TritonModelException(
            "InferenceRequest.async_exec() must be awaited inside 'async def execute'; use exec() in a plain execute"
        ) from None
    it = _start_stream(request, caller_globals)

    async def ready() -> pb_utils.ResponseIterator:
        await asyncio.wrap_future(it._feed.first, loop=loop)
        return it

    return loop.create_task(ready())


# -- the model loading API (pb_utils.load_model / unload_model / is_model_ready) ------------


def _on_loop(what: str, caller_globals: dict[str, Any], call: Any) -> Any:
    """Run ``call(server)`` (a coroutine) on the server's loop and wait for it on this thread;
    errors as Triton's stub raises them: TritonModelException, prefixed with ``what``."""
    server = _dispatcher(caller_globals)
    if server is None or server.loop is None:
        raise pb_utils.TritonModelException(f"{what}: the model loading API needs a running inferd server")
    if _on_server_loop(server.loop):
        raise pb_utils.TritonModelException(f"{what}: called on the server's event loop, where waiting would deadlock")
    try:
        future = asyncio.run_coroutine_threadsafe(call(server), server.loop)
    except RuntimeError as exc:  # the loop is closed: the server stopped
        raise pb_utils.TritonModelException(f"{what}: the server is stopping ({exc})") from None
    try:
        return future.result()
    except InferdError as exc:
        raise pb_utils.TritonModelException(f"{what}: {exc.message}") from None
    except (Exception, asyncio.CancelledError) as exc:
        raise pb_utils.TritonModelException(f"{what}: {type(exc).__name__}: {exc}") from None


def load_model(model_name: str, config: str, files: Any, caller_globals: dict[str, Any]) -> None:
    """``pb_utils.load_model``: (re)load a model of the repository, or one made of ``files``."""
    if not isinstance(config, str):
        raise pb_utils.TritonModelException(
            f"failed to load model '{model_name}', config should be a JSON string, got {type(config).__name__}")
    given: dict[str, bytes] = {}
    if files is not None:
        if not isinstance(files, dict):
            raise pb_utils.TritonModelException(
                f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents")
        for key, value in files.items():
            if not isinstance(key, str) or not isinstance(value, (bytes, bytearray)):
                raise pb_utils.TritonModelException(
                    f"failed to load model '{model_name}', files should map a 'file:<path>' string to the "
                    f"file's bytes, got {key!r}: {type(value).__name__}")
            given[key] = bytes(value)

    async def call(server: InferenceDispatcher) -> None:
        await server.load_model(model_name, config, given)

    _on_loop("Failed to load model", caller_globals, call)


def unload_model(model_name: str, unload_dependents: bool, caller_globals: dict[str, Any]) -> None:
    """``pb_utils.unload_model``: new requests to the model are refused when it returns."""

    async def call(server: InferenceDispatcher) -> None:
        await server.unload_model(model_name, bool(unload_dependents))

    _on_loop("Failed to unload model", caller_globals, call)


def is_model_ready(model_name: str, model_version: str, caller_globals: dict[str, Any]) -> bool:
    """``pb_utils.is_model_ready``: ``model_version`` a string ("" = as the model's policy chooses)."""
    version = 0
    if model_version != "":
        try:
            version = int(model_version)
        except (TypeError, ValueError):
            raise pb_utils.TritonModelException(
                f"Failed to check model readiness: failed to get model version from specified version string "
                f"'{model_version}', version should be an integral value > 0") from None
        if version < 0:
            raise pb_utils.TritonModelException(
                f"Failed to check model readiness: failed to get model version from specified version string "
                f"'{model_version}', version should be an integral value > 0")

    async def call(server: InferenceDispatcher) -> bool:
        return await server.model_is_ready(model_name, version)

    return bool(_on_loop("Failed to check model readiness", caller_globals, call))
