"""A model instance in a host process, as the core's schedulers see it.

:class:`HostedInstance` is a :class:`~inferd.backends.ModelInstance` whose batches run in a model
host (:mod:`inferd.hosts.runtime`): the core keeps the queues, batching decisions, sequences,
ensembles, priorities and statistics; the host holds the backend's own instance. It is *remote*:
the instance worker hands it a formed batch on the event loop (:meth:`HostedInstance.submit`)
and is told on the loop when the outcome is back, with no thread of the core waiting: the
batch's inputs are written once into the to-host arena, the outputs read back from the
from-host arena, and only headers cross the channel (:mod:`inferd.hosts.protocol`).

What the core does for its host:

- a decoupled request's responses are put into the request's sink as they come (a
  :class:`~inferd.streaming.ResponseSink` paced: the host gets each response's credit back only
  while the client keeps up; a client that stops reading for ``--stream-stall-timeout`` ends the
  stream RESOURCE_EXHAUSTED, as on the other paths); the client going away is sent at once
  (:class:`~inferd.hosts.protocol.Cancel`);
- the model's calls into the server (BLS, the model loading API) are run through the instance's
  dispatcher, as an in-process instance's are;
- a host that dies (a crash, an OOM kill, a kill of ours) fails the batches and streams it had
  with an error naming the model, instance, process and cause, and is started again (with
  :class:`~inferd.ipc.processes.RestartState`'s delay when it keeps dying); batches handed over
  meanwhile wait for it. A model that keeps sending after its client left
  (:class:`~inferd.hosts.protocol.Ignoring`) or runs past ``inferd.execution_timeout_microseconds``
  is stopped with its host;
- unloading asks the host to finalize and exit, and kills it past the grace
  (:class:`~inferd.hosts.registry.Hosts`' ``finalize_grace``): whatever the model does, an unload
  ends in bounded time and gives its memory back to the system.

It is created, warmed up and closed on a loader thread of the core (as every instance is), which
waits while the loop does the work: the loop keeps serving every other model meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from inferd.backends.base import BatchResult, ExecutionTimes, InstanceSpec, ModelInstance
from inferd.clock import Clock, MonotonicClock, TimerHandle
from inferd.config import ModelSpec
from inferd.errors import DeadlineExceeded, InferdError, ModelExecutionError, Unavailable
from inferd.hosts import protocol as p
from inferd.hosts.process import HostProcess
from inferd.ipc.processes import RestartPolicy, RestartState
from inferd.observability.procfs import private_bytes
from inferd.observability.tracing import bls_call, trace_context
from inferd.streaming import ResponseSink, StreamEvent
from inferd.types import InferenceRequest, RequestedOutput

if TYPE_CHECKING:
    from inferd.hosts.registry import Hosts

log = logging.getLogger(__name__)

# How long a footprint is waited for from the host (which reads it on a thread at its lowest priority): past
# it, or with no answer, the core reads the host's /proc itself.
FOOTPRINT_TIMEOUT = 5.0

Done = Callable[[BatchResult | BaseException], None]


@dataclass(slots=True)
class _Batch:
    host: HostProcess
    done: Done
    traced: list[int]  # its rows' rids whose trace a BLS call may name, until the batch ends
    timer: TimerHandle | None = None


@dataclass(slots=True)
class _Stream:
    """A request with a response sink, open in the host from its first batch to its final response."""

    rid: int
    key: int  # id() of its InferenceRequest
    responder: Any
    stall: TimerHandle | None = None
    ended: bool = False


@dataclass(slots=True)
class _Waiting:
    inputs: Sequence[dict[str, np.ndarray]]
    outputs: Sequence[str]
    done: Done


@dataclass(slots=True)
class _Call:
    task: asyncio.Task | None = None
    credit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(p.CALL_WINDOW))


class HostedInstance(ModelInstance):
    remote = True  # the instance worker hands it batches on the loop (:meth:`submit`)
    thread_only = True  # never executed inline on the loop
    wants_requests = True  # each row's id, parameters and response sink travel with it

    def __init__(self, backend: str, spec: ModelSpec, instance: InstanceSpec, hosts: "Hosts",
                 clock: Clock | None = None) -> None:
        super().__init__(spec, instance)
        self.hosts = hosts
        self.clock = clock or MonotonicClock()
        self.dispatcher = instance.dispatcher
        loop = self.dispatcher.loop if self.dispatcher is not None else None
        if loop is None:
            raise Unavailable(f"model '{spec.name}': a model host needs a running server (its event loop)")
        self.loop = loop
        self.label = f"{spec.name}-{instance.name}".replace("/", "_")
        self._load = p.Load(backend, pickle.dumps(spec), p.InstanceInfo(
            instance.name, instance.device.kind, instance.device.index, str(instance.model_dir),
            str(instance.version_dir), instance.version, str(instance.model_file), instance.threads, instance.group),
            str(instance.session_cache.folder) if instance.session_cache is not None else None,
            logging.getLogger().level)
        self.host: HostProcess | None = None
        self.pid = 0
        self.rss = 0  # the host's resident memory once loaded: the model's footprint
        self.restarts = 0
        self.failed: str | None = None  # why batches cannot run now (a restart failed)
        self._timeout_s = spec.params.execution_timeout_microseconds / 1e6
        self._ids = itertools.count(1)
        self._batches: dict[int, _Batch] = {}
        self._inputs: dict[int, int] = {}  # batch -> its block in the to-host arena, until the host releases it
        self._streams: dict[int, _Stream] = {}
        self._rid_of: dict[int, int] = {}  # id(request) -> rid, while its stream is open
        self._traces: dict[int, Any] = {}  # rid -> the request's trace, while a BLS call may name it
        self._calls: dict[int, _Call] = {}
        self._asks: dict[int, asyncio.Future] = {}
        self._waiting: list[_Waiting] = []
        self._frees: list[int] = []  # from-host blocks read, to hand back in this turn's write
        self._credits: dict[int, int] = {}
        self._flushing = False
        self._held: list[p.Execute] | None = None  # a train's batches, sent in one write (:meth:`hold`)
        self._loaded: asyncio.Future | None = None
        self._restart = RestartState(RestartPolicy())
        self._started = 0.0
        self._closing = False
        self._wait(self._start())
        hosts.add(self)

    # -- the loader thread's side ------------------------------------------------------------

    def _wait(self, coro: Any) -> Any:
        """Run ``coro`` on the loop and wait for it here (a loader thread; never the loop itself)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError(f"model '{self.model.name}': a hosted instance is created and closed off the event loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        """A batch run from a thread (warm-up, calibration): submitted on the loop, waited for here."""

        async def run() -> BatchResult:
            future = self.loop.create_future()
            self.submit(inputs, output_names, lambda r: future.done() or future.set_result(r))
            result = await future
            if isinstance(result, BaseException):
                raise result
            return result

        return self._wait(run())  # type: ignore[no-any-return]

    def close(self) -> None:
        """Unload: the host finalizes its model and exits, or is killed past the grace."""
        self._closing = True
        if self.loop.is_closed():
            if self.host is not None:
                self.host.kill()
            return
        self._wait(self._stop())

    # -- start, loss, restart (on the loop) ----------------------------------------------------

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loaded = loop.create_future()
        host = await HostProcess.spawn(self.label, self._on_message, self.hosts.zygote)
        self.host = host
        self._started = self.clock.now()
        host.send(self._load)
        await asyncio.wait([self._loaded, host.gone], return_when=asyncio.FIRST_COMPLETED)
        if not self._loaded.done():
            self.host = None
            host.close()
            raise ModelExecutionError(f"model '{self.model.name}': its host process (pid {host.pid}) "
                                      f"{host.describe_exit()} while loading the model")
        loaded: p.Loaded = self._loaded.result()
        if loaded.failure is not None:
            self.host = None
            await host.stop(self.hosts.finalize_grace)
            raise loaded.failure.error()
        self.pid, self.rss = loaded.pid, loaded.rss
        self.ready_check = self._ready if loaded.ready_check else None
        host.gone.add_done_callback(lambda _: self._lost(host))
        log.info("model '%s' instance %s: in host process %d (%.1f MiB)", self.model.name, self.name, self.pid,
                 self.rss / 2**20)

    def _lost(self, host: HostProcess) -> None:
        """The host has exited: fail what it had, and start another unless unloading."""
        if host is self.host:
            self.host = None
        why = (f"model '{self.model.name}' instance {self.name}: its host process (pid {host.pid}) "
               f"{host.describe_exit()}")
        self._fail_host(host, Unavailable(f"{why}; " + ("the model is unloading" if self._closing else
                                                        "the host is restarted")))
        host.close()
        if self._closing:
            return
        log.error("%s; restarting it", why)
        self.restarts += 1
        self.hosts.restarted(self.model.name)
        self.loop.create_task(self._restart_host(self.clock.now()))

    def _fail_host(self, host: HostProcess, error: InferdError) -> None:
        for batch_id in [b for b, batch in self._batches.items() if batch.host is host]:
            self._finish(batch_id, error)
        for stream in list(self._streams.values()):
            self._end_stream(stream)
            self._put(stream, StreamEvent(error=error, final=True))
        for call in self._calls.values():
            if call.task is not None:
                call.task.cancel()
        self._calls.clear()
        for future in self._asks.values():
            if not future.done():
                future.set_exception(error)
        self._asks.clear()
        self._frees.clear()
        self._credits.clear()

    async def _restart_host(self, died: float) -> None:
        while not self._closing:
            when = self._restart.next_start(self._started, died)
            if when > self.clock.now():
                await asyncio.sleep(when - self.clock.now())
            try:
                await self._start()
            except (InferdError, OSError) as exc:  # OSError: ZygoteFailed too
                self.failed = (f"model '{self.model.name}' instance {self.name} is unavailable: restarting its "
                               f"host failed: {exc}")
                log.error("%s", self.failed)
                for waiting in self._take_waiting():
                    waiting.done(Unavailable(self.failed))
                died = self.clock.now()
                continue
            self.failed = None
            for waiting in self._take_waiting():
                self.submit(waiting.inputs, waiting.outputs, waiting.done)
            return

    def _take_waiting(self) -> list[_Waiting]:
        waiting, self._waiting = self._waiting, []
        return waiting

    async def _stop(self) -> None:
        error = Unavailable(f"model '{self.model.name}' instance {self.name} is unloading")
        for waiting in self._take_waiting():
            waiting.done(error)
        host = self.host
        if host is not None:
            await host.stop(self.hosts.grace(self.loop.time()))  # its loss fails what it had left
        self.hosts.remove(self)

    # -- batches (on the loop) -----------------------------------------------------------------

    def submit(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str], done: Done) -> None:
        """Hand a batch to the host; ``done(result or error)`` is called on the loop, never before this
        returns when the batch reached the host."""
        host = self.host
        if host is None or self._loaded is None or not self._loaded.done():
            if self.failed is not None and host is None and not self._closing:
                done(Unavailable(self.failed))
            elif self._closing:
                done(Unavailable(f"model '{self.model.name}' instance {self.name} is unloading"))
            else:
                self._waiting.append(_Waiting(inputs, output_names, done))
            return
        rows: list[p.Row] = []
        try:
            block, refs = p.write_tensors(host.to_host, inputs)
        except InferdError as exc:  # the arena is full: this batch fails, the next may fit
            done(exc)
            return
        for item, tensors in zip(inputs, refs):
            rows.append(self._row(item, tensors))
        batch = next(self._ids)
        traced = [row.rid for row in rows if row.trace is not None and not row.stream]
        self._batches[batch] = entry = _Batch(host, done, traced)
        if block != p.NO_BLOCK:
            self._inputs[batch] = block
        if self._timeout_s:
            entry.timer = self.clock.call_at(self.clock.now() + self._timeout_s, lambda: self._overran(batch))
        frees, self._frees = self._frees, []
        msg = p.Execute(batch, rows, list(output_names), block, frees)
        if self._held is not None:
            self._held.append(msg)
        else:
            host.send(msg)

    @property
    def trains(self) -> bool:
        """Whether it takes several batches at once (:meth:`hold`): not with an execution timeout, whose
        timer runs from when a batch is handed over."""
        return not self._timeout_s

    def hold(self) -> None:
        """Batches submitted from here to :meth:`release` (a train: the scheduler hands a lone host the
        ready batches of its queue at once) go to the host in one write, and its model thread reads
        them with one wake-up."""
        self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        host = self.host
        if held and host is not None:
            host.send_batches(held)

    def _row(self, item: dict[str, np.ndarray], tensors: list[p.TensorRef]) -> p.Row:
        request: InferenceRequest | None = getattr(item, "request", None)
        if request is None:  # warm-up, calibration, a sequence batch's filler row
            return p.Row(next(self._ids), "", {}, None, 0, 0, False, False, tensors, None)
        responder = request.responder
        rid = self._rid_of.get(id(request)) if responder is not None else None
        if rid is None:
            rid = next(self._ids)
            if responder is not None:
                self._open_stream(rid, request, responder)
        requested = None if request.requested_outputs is None else [r.name for r in request.requested_outputs]
        context = None
        if request.trace is not None:
            self._traces[rid] = request.trace
            context = trace_context(request.trace)
        return p.Row(rid, request.id, request.parameters, requested, request.correlation_id, request.flags,
                     request.cancelled, responder is not None, tensors, context)

    def _result(self, msg: p.Result) -> None:
        host = self.host
        block = self._inputs.pop(msg.batch, p.NO_BLOCK)
        if msg.release and host is not None and block != p.NO_BLOCK:
            host.to_host.free(block)  # else the host releases it once its streams end
        batch = self._batches.get(msg.batch)
        if batch is None or host is None:  # answered already (its timeout)
            self._free(msg.block)
            return
        outputs: list[dict[str, np.ndarray] | InferdError] = []
        failures = msg.failures or [None] * len(msg.rows)
        for row, failure in zip(msg.rows, failures):
            if failure is not None:
                outputs.append(failure.error())
            else:
                outputs.append(p.read_tensors(host.from_host, row, f"model '{self.model.name}'", copy=True))
        self._free(msg.block)
        real, pad = msg.elements
        self._finish(msg.batch, BatchResult(outputs, ExecutionTimes(*msg.times), real, pad,
                                             memory_delta=msg.memory_delta, reschedule=msg.reschedule))

    def _finish(self, batch_id: int, result: BatchResult | BaseException) -> None:
        batch = self._batches.pop(batch_id, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        for rid in batch.traced:
            self._traces.pop(rid, None)
        batch.done(result)

    def _overran(self, batch_id: int) -> None:
        if batch_id not in self._batches or self.host is None:
            return
        limit_us = round(self._timeout_s * 1e6)
        self._finish(batch_id, DeadlineExceeded(
            f"model '{self.model.name}': the execution on instance {self.name} ran past "
            f"inferd.execution_timeout_microseconds ({limit_us} us); its host process (pid {self.pid}) is "
            "stopped and a new one takes the next requests"))
        log.error("model '%s' instance %s: an execution ran past %d us; killing its host (pid %d)",
                  self.model.name, self.name, limit_us, self.pid)
        self._kill()

    # -- messages from the host (on the loop) --------------------------------------------------

    def _on_message(self, data: bytes) -> None:
        msg = p.from_host(data)
        if isinstance(msg, p.Result):
            self._result(msg)
        elif isinstance(msg, p.Response):
            self._response(msg)
        elif isinstance(msg, p.Call):
            self._call(msg)
        elif isinstance(msg, p.CallCredit):
            call = self._calls.get(msg.cid)
            if call is not None:
                for _ in range(msg.n):
                    call.credit.release()
        elif isinstance(msg, p.CallCancel):
            call = self._calls.pop(msg.cid, None)
            if call is not None and call.task is not None:
                call.task.cancel()
        elif isinstance(msg, p.Release):
            if self.host is not None:
                for block in msg.blocks:
                    self.host.to_host.free(block)
        elif isinstance(msg, p.Answer):
            future = self._asks.pop(msg.cid, None)
            if future is not None and not future.done():
                if msg.failure is not None:
                    future.set_exception(msg.failure.error())
                else:
                    future.set_result(msg.value)
        elif isinstance(msg, p.Loaded):
            if self._loaded is not None and not self._loaded.done():
                self._loaded.set_result(msg)
        elif isinstance(msg, p.Ignoring):
            self._ignoring(msg)

    def _free(self, block: int) -> None:
        """A from-host block read: handed back with the next batch (or, once many wait, in a Free of their own)."""
        if block == p.NO_BLOCK or self.host is None:
            return
        self._frees.append(block)
        if len(self._frees) >= p.FREE_BATCH:
            self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """The blocks read and the credits earned in this turn, in one message each."""
        self._flushing = False
        host = self.host
        if host is None:
            self._frees.clear()
            self._credits.clear()
            return
        if self._frees:
            frees, self._frees = self._frees, []
            host.send(p.Free(frees))
        if self._credits:
            credits, self._credits = self._credits, {}
            for rid, n in credits.items():
                if n >= p.CREDIT_EVERY:
                    host.send(p.Credit(rid, n))
                else:  # not worth a wake-up of the host yet
                    self._credits[rid] = n

    def _ignoring(self, msg: p.Ignoring) -> None:
        host = self.host
        if host is None:
            return
        log.error("model '%s' instance %s: the model sent %d responses for a request after its client had gone "
                  "(each refused: 'Response sender has been closed'); stopping its host process (pid %d)",
                  self.model.name, self.name, msg.sends, host.pid)
        self._kill()

    def _kill(self) -> None:
        """Stop the host now: batches handed over from here on wait for the next one (its loss, when its
        exit is seen, fails what it still had and starts that one)."""
        host, self.host = self.host, None
        if host is not None:
            host.kill()

    # -- decoupled responses -----------------------------------------------------------------------

    def _open_stream(self, rid: int, request: InferenceRequest, responder: Any) -> None:
        stream = _Stream(rid, id(request), responder)
        self._streams[rid] = stream
        self._rid_of[stream.key] = rid
        watch = getattr(responder, "on_cancel", None)
        if watch is not None:
            watch(lambda: self.loop.call_soon_threadsafe(self._cancelled, stream))

    def _cancelled(self, stream: _Stream) -> None:
        """The client has gone: the host closes the request's sender; its later responses are dropped."""
        if stream.ended:
            return
        self._end_stream(stream)
        if self.host is not None:
            self.host.send(p.Cancel(stream.rid))

    def _end_stream(self, stream: _Stream) -> None:
        stream.ended = True
        self._streams.pop(stream.rid, None)
        self._credits.pop(stream.rid, None)
        self._traces.pop(stream.rid, None)
        if self._rid_of.get(stream.key) == stream.rid:
            del self._rid_of[stream.key]
        if stream.stall is not None:
            stream.stall.cancel()
            stream.stall = None

    def _response(self, msg: p.Response) -> None:
        stream = self._streams.get(msg.rid)
        outputs = None
        if msg.outputs is not None and stream is not None and self.host is not None:
            outputs = p.read_tensors(self.host.from_host, msg.outputs, f"model '{self.model.name}'", copy=True)
        self._free(msg.block)
        if stream is None:  # cancelled, or ended by its host's loss
            return
        event = StreamEvent(outputs=outputs, error=msg.failure.error() if msg.failure is not None else None,
                            final=msg.final, sent_ns=msg.sent_ns)
        if msg.final:
            self._end_stream(stream)
        self._put(stream, event)

    def _put(self, stream: _Stream, event: StreamEvent) -> None:
        """Into the request's sink, never waiting (on the loop): a plain sink is put ``paced`` and the
        host's credit comes back once the client has read below the stream's bound."""
        responder = stream.responder
        if not isinstance(responder, ResponseSink):  # a scheduler's own (iterative: paced between steps)
            responder.put(event)
            self._credit(stream)
            return
        responder.put(event, paced=True)
        if event.final:
            return
        if not responder.resume_when_room(0, 0, lambda: self._resumed(stream)):
            self._credit(stream)
        elif stream.stall is None:
            limits = responder.limits
            stream.stall = self.clock.call_at(self.clock.now() + limits.stall_seconds, lambda: self._stalled(stream))

    def _credit(self, stream: _Stream) -> None:
        if stream.ended or self.host is None:
            return
        n = self._credits[stream.rid] = self._credits.get(stream.rid, 0) + 1
        if n >= p.CREDIT_EVERY:
            self._flush_soon()

    def _resumed(self, stream: _Stream) -> None:
        if stream.stall is not None:
            stream.stall.cancel()
            stream.stall = None
        self._credit(stream)

    def _stalled(self, stream: _Stream) -> None:
        """The client read nothing for the stall timeout: the stream ends, and the model is told."""
        stream.stall = None
        if stream.ended:
            return
        responder = stream.responder
        error = responder.exhausted(f"and it read none for {responder.limits.stall_seconds:g} s "
                                    "(--stream-stall-timeout)")
        self._cancelled(stream)
        responder.put(StreamEvent(error=error, final=True), paced=True)

    # -- the model's calls into the server ---------------------------------------------------------

    def _call(self, msg: p.Call) -> None:
        call = self._calls[msg.cid] = _Call()
        call.task = self.loop.create_task(self._serve_call(msg, call), name=f"host call {msg.method}")

    async def _serve_call(self, msg: p.Call, call: _Call) -> None:
        host = self.host
        if host is None:
            return
        try:
            if msg.request is None:
                await self._control(host, msg)
                return
            request = self._bls_request(host, msg.request)
            if msg.method == "infer_stream":
                await self._stream_call(host, msg.cid, request, call)
            else:
                try:
                    response = await self.dispatcher.infer(request)
                except InferdError as exc:
                    host.send(_failed(msg.cid, exc))
                else:
                    host.send(self._call_response(host, msg.cid, True, response))
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a bug below: the model still gets an answer
            log.exception("model '%s': a call into the server failed", self.model.name)
            host.send(_failed(msg.cid, exc))
        finally:
            self._calls.pop(msg.cid, None)
            self._free(msg.block)  # the request's inputs are no longer read

    async def _control(self, host: HostProcess, msg: p.Call) -> None:
        method = {"load_model": self.dispatcher.load_model, "unload_model": self.dispatcher.unload_model,
                  "model_is_ready": self.dispatcher.model_is_ready}.get(msg.method)
        try:
            if method is None:
                raise ModelExecutionError(f"model host: '{msg.method}' is not a call into the server")
            value = await method(*msg.args)
        except Exception as exc:
            host.send(p.CallResult(msg.cid, None, p.Failure.of(exc)))
        else:
            host.send(p.CallResult(msg.cid, value, None))

    async def _stream_call(self, host: HostProcess, cid: int, request: InferenceRequest, call: _Call) -> None:
        stream = self.dispatcher.infer_stream(request)
        try:
            async for item in stream:
                await call.credit.acquire()  # the model reads them back (CallCredit)
                if item.error is not None:
                    host.send(_failed(cid, item.error, item.final))
                elif item.response is None:
                    host.send(p.CallResponse(cid, item.final, "", 0, "", {}, [], p.NO_BLOCK, None))
                else:
                    host.send(self._call_response(host, cid, item.final, item.response))
                if item.final:
                    return
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def _bls_request(self, host: HostProcess, bls: p.BlsRequest) -> InferenceRequest:
        inputs = p.read_tensors(host.from_host, bls.inputs, f"BLS request to model '{bls.model}'")
        return InferenceRequest(
            model_name=bls.model, inputs=inputs, model_version=bls.version, id=bls.id, parameters=bls.parameters,
            requested_outputs=None if bls.requested is None else [RequestedOutput(n) for n in bls.requested],
            priority=bls.priority, timeout_us=bls.timeout_us,
            trace=bls_call(self._traces.get(bls.parent), bls.model, bls.version))

    def _call_response(self, host: HostProcess, cid: int, final: bool, response: Any) -> p.CallResponse:
        try:
            block, refs = p.write_tensors(host.to_host, [response.outputs])
        except InferdError as exc:
            return _failed(cid, exc, final)
        return p.CallResponse(cid, final, response.model_name, response.model_version, response.id,
                              dict(response.parameters), refs[0], block, None)

    # -- questions for the host ----------------------------------------------------------------------

    async def ask(self, what: str) -> Any:
        """The host's answer to ``ready``, ``metrics`` or ``footprint`` (on the loop)."""
        host = self.host
        if host is None:
            raise Unavailable(f"model '{self.model.name}' instance {self.name} has no host process now")
        cid = next(self._ids)
        future = self._asks[cid] = self.loop.create_future()
        host.send(p.Ask(cid, what))
        try:
            return await future
        finally:  # answered, or given up on (a timeout): nothing kept
            self._asks.pop(cid, None)

    def footprint(self) -> int:
        """What this instance adds to the server's memory: its host's private pages, read by the host
        itself at its lowest priority (not its RSS, which counts the pages every host shares with the
        zygote: :mod:`inferd.repository.footprint`); the RSS it reported at its load where /proc cannot
        say. Blocking: called off the loop, once the instance is loaded and warmed up; a host that does not
        answer within FOOTPRINT_TIMEOUT (its model's code holding the GIL) is read by this thread."""
        try:
            private = self._wait(asyncio.wait_for(self.ask("footprint"), FOOTPRINT_TIMEOUT))
        except (InferdError, asyncio.TimeoutError):
            private = private_bytes(self.pid) if self.pid else None
        return int(private) if private is not None else self.rss

    def _ready(self) -> bool:
        """The model's own is_ready, asked in its host (blocking: called off the loop)."""
        return bool(asyncio.run_coroutine_threadsafe(self.ask("ready"), self.loop).result())


def _failed(cid: int, exc: BaseException, final: bool = True) -> p.CallResponse:
    return p.CallResponse(cid, final, "", 0, "", {}, [], p.NO_BLOCK, p.Failure.of(exc))
