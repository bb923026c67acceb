"""What a model host does: hold one instance, run its batches, send its responses, and carry
its calls into the server back to the core.

The host process (``python -m inferd.serve.host_process``, spawned by the core's
:class:`inferd.hosts.instance.HostedInstance`) runs two threads of its own:

- its event loop, which reads the core's control messages (:mod:`inferd.hosts.protocol`: cancels,
  credits, answers to calls) and runs the model's calls into the server (BLS, the model loading
  API) as coroutines, as the core's loop runs them in one process;
- the model thread, which reads the batch link itself (blocking) and loads the instance (its
  backend's ``create_instance``: a Python model's ``initialize``), runs each batch's ``execute``
  and, at unload, ``finalize``, one at a time: a batch wakes this thread only, as it would an
  instance thread in the core, and the loop is never blocked by the model's code.

The instance is the backend's own (a Python model's :class:`~inferd.backends.python.PythonInstance`),
created with a dispatcher (:class:`HostDispatcher`) whose calls go to the core over the channel: a
Python model runs here exactly as it does in the core, with the whole pb_utils API. A decoupled
request's responses go through a :class:`HostSender`, its response sink here: each one is written
into the from-host arena and sent at once; at most ``RESPONSE_WINDOW`` of them may be unacknowledged
by the core (a model sending faster than its client reads waits in ``send``), and once the client
has gone the model's ``send`` raises, as on a closed sender; a model that catches that and sends
again is reported (:class:`~inferd.hosts.protocol.Ignoring`) and the core stops the host.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from inferd.backends import Device, InstanceSpec, ModelInstance, get as backend_named
from inferd.backends.base import BatchResult, RequestInputs, resident_bytes
from inferd.backends.session_cache import SessionCache
from inferd.errors import InferdError, ModelExecutionError
from inferd.hosts import priority, protocol as p
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.frames import FrameChannel, FrameReader, FrameWriter
from inferd.observability import collector, custom_metrics
from inferd.observability.procfs import private_bytes
from inferd.streaming import StreamEvent, StreamResponse
from inferd.types import InferenceRequest, InferenceResponse, RequestedOutput

log = logging.getLogger("inferd.host")

# A model still sending for a cancelled request this long after the cancel, or this many times, is
# stopped with its host (a model winding a request down sends a step's worth at most).
CANCEL_GRACE = 0.5
RUNAWAY_SENDS = 10_000
EARLY_LIMIT = 1024  # cancels and credits kept for requests whose batch has not been read yet
# A result waits to be sent with the next ones while the next batch of its train is already here, at most
# this long (one write, one wake-up of the core, for a train of fast executions).
RESULT_HOLD_S = 0.0002


class HostSender:
    """A decoupled request's response sink in the host (``request.responder``): ``put`` is called
    by the model's code on any of its threads. Waits while the core has not credited back
    ``RESPONSE_WINDOW`` responses; after a cancel, drops what is put (the model's own ``send``
    raises before it gets here: pb_utils reads ``request.cancelled``)."""

    __slots__ = ("runtime", "rid", "request", "credit", "cancelled", "closed", "started_ns", "_cond", "batches",
                 "_cancelled_at", "_reported")

    def __init__(self, runtime: "HostRuntime", rid: int, request: InferenceRequest) -> None:
        self.runtime = runtime
        self.rid = rid
        self.request = request
        self.credit = p.RESPONSE_WINDOW
        self.cancelled = False
        self.closed = False
        self.started_ns = 0
        self._cond = threading.Condition()
        self.batches: list[int] = []  # batches whose input block waits for this request to end
        self._cancelled_at = 0.0
        self._reported = False

    def put(self, event: StreamEvent) -> None:
        with self._cond:
            while self.credit <= 0 and not self.cancelled:
                self._cond.wait()
            if self.cancelled or self.closed:
                return
            self.credit -= 1
            if event.final:
                self.closed = True
        self.runtime.send_response(self.rid, event)
        if event.final:
            self.runtime.request_ended(self)

    def add_credit(self, n: int) -> None:
        with self._cond:
            self.credit += n
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cancelled_at = time.monotonic()
            self.request.cancelled = True  # what is_cancelled() reads; send() now refuses
            self._cond.notify_all()

    def refused(self, sends: int) -> None:
        """pb_utils' sender refused a ``send`` after the cancel (``sends``: how many so far; any thread).
        A model winding the request down sends a few more at most; one still sending CANCEL_GRACE
        after the cancel, or RUNAWAY_SENDS times, ignores it: the core is told, and stops the host."""
        if self._reported:
            return
        if sends >= RUNAWAY_SENDS or time.monotonic() - self._cancelled_at >= CANCEL_GRACE:
            self._reported = True
            self.runtime.post_threadsafe(p.Ignoring(self.rid, sends))


class HostTrace:
    """A traced request's trace in the host: its W3C context for ``request.trace().get_context()``, and
    the request's number, which a BLS call made with ``trace=request.trace()`` carries to the core,
    where the call's trace is made a child of the request's (``inferd.observability.tracing.bls_call``
    calls :meth:`child`)."""

    __slots__ = ("rid", "context_json")

    def __init__(self, rid: int, context_json: str) -> None:
        self.rid = rid
        self.context_json = context_json

    def child(self, name: str, attributes: dict[str, Any]) -> "HostTrace":
        return self


class HostDispatcher:
    """The server as the hosted instance sees it (:class:`~inferd.backends.InferenceDispatcher`):
    each call is a :class:`~inferd.hosts.protocol.Call` to the core, answered on the host's loop."""

    def __init__(self, runtime: "HostRuntime") -> None:
        self.runtime = runtime
        self.loop: asyncio.AbstractEventLoop | None = None

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        answer = await self.runtime.call("infer", request)
        return self.runtime.response_of(answer)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[StreamResponse]:
        runtime = self.runtime
        cid, queue = runtime.open_stream(request)
        final = False
        try:
            while not final:
                answer: p.CallResponse = await queue.get()
                runtime.post(p.CallCredit(cid, 1))
                final = answer.final
                if answer.failure is not None:
                    yield StreamResponse(error=answer.failure.error(), final=final)
                elif answer.model:
                    yield StreamResponse(response=runtime.response_of(answer), final=final)
                else:
                    yield StreamResponse(final=final)
        finally:
            runtime.streams.pop(cid, None)
            if not final:
                runtime.post(p.CallCancel(cid))

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        await self.runtime.control("load_model", [name, config, files])

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self.runtime.control("unload_model", [name, unload_dependents])

    async def model_is_ready(self, name: str, version: int) -> bool:
        return bool(await self.runtime.control("model_is_ready", [name, version]))


class HostRuntime:
    """The host's state: its instance, the model thread, requests and calls in flight. Every method
    but those marked otherwise runs on the host's loop."""

    def __init__(self, to_host: Arena, from_host: ArenaWriter, batches: FrameReader, out: FrameWriter,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.to_host = to_host  # the core writes; read in place
        self.writer = from_host  # the host writes (any thread: under the lock)
        self.lock = threading.Lock()
        self.batches = batches  # Load, Execute, Finalize: read by the model thread itself
        self.control_link: FrameChannel | None = None  # the core's other messages, read on the loop
        self.out = out  # everything the host sends, from any thread
        self.loop = asyncio.get_running_loop()
        self.dispatcher = HostDispatcher(self)
        self.dispatcher.loop = self.loop
        self.instance: ModelInstance | None = None
        self.name = "?"
        self.senders: dict[int, HostSender] = {}  # the model thread adds, the loop cancels and credits
        self.senders_lock = threading.Lock()
        self.early_cancels: dict[int, bool] = {}
        self.early_credits: dict[int, int] = {}
        self.waiting_blocks: dict[int, tuple[int, set[int]]] = {}  # batch -> (input block, rids still open)
        self.calls: dict[int, asyncio.Future] = {}
        self.streams: dict[int, asyncio.Queue] = {}
        self._cids = itertools.count(1)
        self._exit = exit
        self._thread = threading.Thread(target=self._serve, name="inferd-host-model", daemon=True)
        self._thread.start()

    # -- messages from the core ----------------------------------------------------------

    def on_message(self, data: bytes) -> None:
        """A message of the control link (on the loop)."""
        msg = p.to_host(data)
        if isinstance(msg, p.Cancel):
            with self.senders_lock:
                sender = self.senders.get(msg.rid)
                if sender is None:  # its batch is still on the batch link: its sender starts cancelled
                    self._early(self.early_cancels, msg.rid, True)
            if sender is not None:
                sender.cancel()
                self.request_ended(sender)
        elif isinstance(msg, p.Credit):
            with self.senders_lock:
                sender = self.senders.get(msg.rid)
                if sender is None:
                    self._early(self.early_credits, msg.rid, self.early_credits.get(msg.rid, 0) + msg.n)
            if sender is not None:
                sender.add_credit(msg.n)
        elif isinstance(msg, (p.CallResponse, p.CallResult)):
            self._answered(msg)
        elif isinstance(msg, p.Free):
            with self.lock:
                for block in msg.blocks:
                    self.writer.free(block)
        elif isinstance(msg, p.Ask):
            self._ask(msg)

    @staticmethod
    def _early(found: dict, rid: int, value: Any) -> None:
        """What came for a request before its batch (the two links race); a few at most: bounded."""
        found[rid] = value
        if len(found) > EARLY_LIMIT:
            del found[next(iter(found))]

    def closed(self) -> None:
        """The channel closed: the core has gone (or gave up on this host). Nothing of ours may outlive it."""
        self._exit(0)

    # -- the model thread --------------------------------------------------------------

    def _serve(self) -> None:
        held: list[bytes] = []  # results of a train's batches, sent together (RESULT_HOLD_S)
        since = 0.0
        while True:
            if held and (not self.batches.ready() or time.monotonic() - since >= RESULT_HOLD_S):
                self._send_held(held)
            data = self.batches.read()
            if data is None:  # the core has gone
                self._exit(0)
                return
            msg = p.to_host(data)
            if held and not isinstance(msg, p.Execute):
                self._send_held(held)
            try:
                if isinstance(msg, p.Execute):
                    if not held:
                        since = time.monotonic()
                    held.append(p.encode(self._execute(msg)))
                elif isinstance(msg, p.Load):
                    self._load(msg)
                elif isinstance(msg, p.Finalize):
                    self._finalize()
                    return
            except BaseException:  # a bug of ours: the core sees the host fail, not hang
                log.exception("model host for '%s' failed", self.name)
                self.post_threadsafe(None)
                return

    def _load(self, msg: p.Load) -> None:
        info = msg.instance
        logging.getLogger().setLevel(msg.log_level)
        failure = None
        try:
            spec = pickle.loads(msg.spec)
            self.name = spec.name
            backend = backend_named(msg.backend)
            ispec = InstanceSpec(
                name=info.name, device=Device(info.device_kind, info.device_index), model_dir=Path(info.model_dir),
                version_dir=Path(info.version_dir), version=info.version, model_file=Path(info.model_file),
                threads=info.threads, group=info.group, dispatcher=self.dispatcher,
                session_cache=SessionCache(Path(msg.session_cache)) if msg.session_cache else None)
            with priority.loading():  # warm requests of other models first (hosts/priority.py)
                self.instance = backend.create_instance(spec, ispec)
                collector.freeze()  # the host lives as long as its model: all it holds, out of full collections
        except KeyError:
            failure = p.Failure("ConfigError", f"model host: backend '{msg.backend}' is not installed where the "
                                "host runs (a backend registered from code lives only in the server's process)")
        except BaseException as exc:
            failure = p.Failure.of(exc)
        ready_check = self.instance is not None and self.instance.ready_check is not None
        self.post_threadsafe(p.Loaded(os.getpid(), resident_bytes(), ready_check, failure))

    def _send_held(self, held: list[bytes]) -> None:
        if self.out is not None:
            self.out.send_many(held)
        held.clear()

    def _execute(self, msg: p.Execute) -> p.Result:
        if msg.free:
            with self.lock:
                for block in msg.free:
                    self.writer.free(block)
        instance = self.instance
        rows = [self._row(msg.batch, row) for row in msg.rows]
        try:
            if instance is None:
                raise ModelExecutionError(f"model '{self.name}': the host holds no instance")
            inputs = rows if instance.wants_requests else [dict(r) for r in rows]
            result = instance.execute(inputs, msg.outputs)
        except BaseException as exc:  # every batch is answered
            result = BatchResult([exc if isinstance(exc, InferdError) else ModelExecutionError(
                f"model '{self.name}' failed to execute: {type(exc).__name__}: {exc}")] * len(rows))
        return self._answer(msg, result)

    def _row(self, batch: int, row: p.Row) -> RequestInputs:
        request = InferenceRequest(
            model_name=self.name, inputs=p.read_tensors(self.to_host, row.inputs, f"model '{self.name}'"),
            id=row.id, parameters=row.parameters,
            requested_outputs=None if row.requested is None else [RequestedOutput(n) for n in row.requested],
            correlation_id=row.correlation_id, flags=row.flags, cancelled=row.cancelled,
            trace=HostTrace(row.rid, row.trace) if row.trace is not None else None)
        if row.stream:
            with self.senders_lock:
                sender = self.senders.get(row.rid)
                if sender is None:
                    sender = self.senders[row.rid] = HostSender(self, row.rid, request)
                    cancelled = self.early_cancels.pop(row.rid, False)
                    sender.credit += self.early_credits.pop(row.rid, 0)
                    if cancelled:
                        sender.cancel()
                else:  # the next step of an iterative sequence: the same sender, this step's request
                    sender.request = request
                    request.cancelled = sender.cancelled
            request.responder = sender
        return RequestInputs(request)

    def _answer(self, msg: p.Execute, result: BatchResult) -> p.Result:
        groups: list[dict[str, Any]] = []
        failures: dict[int, p.Failure] = {}
        for i, out in enumerate(result.outputs):
            if isinstance(out, BaseException):
                failures[i] = p.Failure.of(out)
                groups.append({})
            else:
                groups.append(out)
        try:
            block, refs = p.write_tensors(self.writer, groups, self.lock)
        except Exception as exc:  # the arena is full, an output cannot be written: the batch fails, the host serves on
            if not isinstance(exc, InferdError):
                exc = ModelExecutionError(f"model '{self.name}': its outputs cannot be sent: {type(exc).__name__}: {exc}")
            block, refs = p.NO_BLOCK, [[] for _ in groups]
            failures = {i: p.Failure.of(exc) for i in range(len(groups))}
        failed = [failures.get(i) for i in range(len(refs))] if failures else []
        t = result.times
        again = result.reschedule or [False] * len(msg.rows)
        open_rids = {row.rid for i, row in enumerate(msg.rows) if row.stream and not again[i]
                     and row.rid in self.senders and not self.senders[row.rid].closed}
        release = not open_rids
        if not release:
            self.waiting_blocks[msg.batch] = (msg.block, open_rids)
            for rid in open_rids:
                self.senders[rid].batches.append(msg.batch)
        return p.Result(msg.batch, refs, failed, block, (t.input_ns, t.infer_ns, t.output_ns),
                        result.memory_delta, result.reschedule, release, (result.real_elements, result.pad_elements))

    def _finalize(self) -> None:
        priority.leaving()  # the model's finalize and this process's exit give way to warm requests
        instance, self.instance = self.instance, None
        if instance is not None:
            try:
                instance.close()
            except Exception:
                log.exception("model '%s': closing its instance failed", self.name)
        self.post_threadsafe(None)

    # -- decoupled responses (any thread) --------------------------------------------

    def send_response(self, rid: int, event: StreamEvent) -> None:
        block, refs = p.NO_BLOCK, None
        failure = p.Failure.of(event.error) if event.error is not None else None
        if event.outputs is not None:
            try:
                block, groups = p.write_tensors(self.writer, [event.outputs], self.lock)
                refs = groups[0]
            except InferdError as exc:
                failure = p.Failure.of(exc)
        self.post_threadsafe(p.Response(rid, event.final, refs, block, failure, event.sent_ns))

    def request_ended(self, sender: HostSender) -> None:
        """A decoupled request sent its final response or was cancelled: forget it, and hand back
        the input blocks that waited only for it. Any thread."""
        self.loop.call_soon_threadsafe(self._ended, sender)

    def _ended(self, sender: HostSender) -> None:
        with self.senders_lock:
            if self.senders.get(sender.rid) is sender:
                del self.senders[sender.rid]
        freed = []
        for batch in sender.batches:
            entry = self.waiting_blocks.get(batch)
            if entry is None:
                continue
            entry[1].discard(sender.rid)
            if not entry[1]:
                del self.waiting_blocks[batch]
                if entry[0] != p.NO_BLOCK:
                    freed.append(entry[0])
        if freed:
            self.post(p.Release(freed))

    # -- sending -------------------------------------------------------------------------

    def post(self, msg: Any) -> None:
        """Send a message now, from any thread (the host writes its socket directly: a result or a
        response costs no wake-up of the loop)."""
        if self.out is not None:
            self.out.send(p.encode(msg))

    def post_threadsafe(self, msg: Any) -> None:
        """As :meth:`post`; ``None``: the model thread has ended (finalize done, or it failed): exit."""
        if msg is None:
            self._exit(0)
            return
        self.post(msg)

    # -- calls into the server ------------------------------------------------------------

    def _bls_request(self, request: InferenceRequest) -> tuple[p.BlsRequest, int]:
        block, refs = p.write_tensors(self.writer, [request.inputs], self.lock)
        requested = None if request.requested_outputs is None else [r.name for r in request.requested_outputs]
        parent = request.trace.rid if isinstance(request.trace, HostTrace) else -1
        return p.BlsRequest(request.model_name, request.model_version, request.id, dict(request.parameters),
                            requested, request.priority, request.timeout_us, refs[0], parent), block

    async def call(self, method: str, request: InferenceRequest) -> p.CallResponse:
        bls, block = self._bls_request(request)
        cid = next(self._cids)
        future = self.loop.create_future()
        self.calls[cid] = future
        self.post(p.Call(cid, method, bls, [], block))
        try:
            return await future
        except asyncio.CancelledError:
            self.post(p.CallCancel(cid))
            raise
        finally:
            self.calls.pop(cid, None)

    def open_stream(self, request: InferenceRequest) -> tuple[int, asyncio.Queue]:
        bls, block = self._bls_request(request)
        cid = next(self._cids)
        queue: asyncio.Queue = asyncio.Queue()
        self.streams[cid] = queue
        self.post(p.Call(cid, "infer_stream", bls, [], block))
        return cid, queue

    async def control(self, method: str, args: list[Any]) -> Any:
        cid = next(self._cids)
        future = self.loop.create_future()
        self.calls[cid] = future
        self.post(p.Call(cid, method, None, args, p.NO_BLOCK))
        try:
            answer: p.CallResult = await future
        finally:
            self.calls.pop(cid, None)
        if answer.failure is not None:
            raise answer.failure.error()
        return answer.value

    def _answered(self, msg: p.CallResponse | p.CallResult) -> None:
        queue = self.streams.get(msg.cid) if isinstance(msg, p.CallResponse) else None
        if queue is not None:
            queue.put_nowait(msg)
            return
        future = self.calls.get(msg.cid)
        if future is not None and not future.done():
            future.set_result(msg)
        elif isinstance(msg, p.CallResponse) and msg.block != p.NO_BLOCK:
            self.post(p.Release([msg.block]))  # nobody waits for it any more

    def response_of(self, answer: p.CallResponse) -> InferenceResponse:
        """A BLS call's response, its tensors copied out of the arena (the model may keep them)."""
        if answer.failure is not None:
            if answer.block != p.NO_BLOCK:
                self.post(p.Release([answer.block]))
            raise answer.failure.error()
        outputs = p.read_tensors(self.to_host, answer.outputs, f"BLS response of model '{answer.model}'", copy=True)
        if answer.block != p.NO_BLOCK:
            self.post(p.Release([answer.block]))
        return InferenceResponse(answer.model, answer.version, outputs, answer.id, answer.parameters)

    # -- questions ---------------------------------------------------------------------------

    def _ask(self, msg: p.Ask) -> None:
        if msg.what == "metrics":
            self.post(p.Answer(msg.cid, custom_metrics.REGISTRY.snapshot(), None))
            return
        if msg.what == "footprint":  # this host's private memory: what its model adds to the server

            def measure() -> int | None:
                priority.lowest()  # the walk of our page tables gives way to warm requests
                return private_bytes()

            self._answer_off_loop(msg.cid, "footprint", measure, None)
            return
        instance = self.instance
        check = instance.ready_check if instance is not None else None
        self._answer_off_loop(msg.cid, "ready", lambda: bool(check()) if check is not None else True, False)

    def _answer_off_loop(self, cid: int, what: str, compute: Callable[[], Any], failed: Any) -> None:
        """Answer ``cid`` with ``compute()`` from a thread of its own (it may block: the model's is_ready, a
        walk of /proc), or with ``failed`` and the error it raised."""

        def answer() -> None:
            try:
                value, failure = compute(), None
            except BaseException as exc:
                value, failure = failed, p.Failure.of(exc)
            self.post_threadsafe(p.Answer(cid, value, failure))

        threading.Thread(target=answer, name=f"inferd-host-{what}", daemon=True).start()
