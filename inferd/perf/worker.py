"""One load-generating process.

The controlling process starts it with ``multiprocessing`` (spawn) and talks to it over a Pipe:

    ("closed", concurrency, count|None)                      -> ("ok",)
    ("open", rate, distribution, offset_s, count|None, max_inflight, seed, gaps_ns|None) -> ("ok",)
                 (distribution "intervals": the gaps between this worker's sends, cycled)
    ("drain",)   -> ("records", batch)   everything completed since the last drain
    ("stop",)    -> ("records", batch)   stop sending, wait for the requests in flight
    ("exit",)    -> ("bye",)

``batch`` is a dict: ``start``/``end`` (int64 ns, ``time.monotonic_ns``, which is one clock for
all processes of the machine), ``code`` (int32 gRPC status code, 0 = OK), ``sent``,
``delayed`` and ``due`` (cumulative counts; ``due``: sends the open-loop schedule asked for so far), ``errors`` ({code name: first message}), ``done`` (a request
count is used up and nothing is in flight), ``cpu_s`` (this process's user+system time) and
``t_ns`` (when the counters were read).

Requests are pre-serialized: over gRPC the ModelInferRequest bytes, sent on a raw unary-unary
callable (no serializer, no deserializer); over HTTP (``-i http``) a body and its JSON header's
length, POSTed with aiohttp. A response is never parsed, only its status is looked at.

How each protocol sends is in :mod:`.transport`.
"""

from __future__ import annotations

import asyncio
import resource
import signal
import time
from dataclasses import dataclass, field

import grpc
import grpc.aio
import numpy as np

from inferd import event_loop

from .options import SequenceOptions, TlsOptions
from .transport import GrpcTransport, HttpStatusError, HttpTransport, StreamError

# An open-loop send later than its schedule by more than this counts as delayed.
DELAY_THRESHOLD_NS = 2_000_000
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


@dataclass
class WorkerConfig:
    url: str
    payloads: list  # gRPC: request bytes; HTTP: (body, JSON header length)
    index: int = 0
    connect_timeout: float = 10.0
    stop_timeout: float = 60.0
    protocol: str = "grpc"
    infer_path: str = ""  # HTTP: /v2/models/{model}[/versions/{v}]/infer
    tls: TlsOptions | None = None
    headers: list = field(default_factory=list)  # (name, value) on every request
    streaming: bool = False  # gRPC ModelStreamInfer
    sequence: SequenceOptions | None = None  # the model has sequence_batching
    workers: int = 1  # how many workers share the sequence ids
    seed: int = 0


class SequenceIds:
    """The sequence ids of one worker: START + index, + workers, ... (wrapping at END), so that
    no two workers, and no two sequences of one worker in progress at once, share an id
    while the range has room for them."""

    def __init__(self, options: SequenceOptions, index: int, workers: int) -> None:
        self.start, self.end = options.id_start, options.id_end
        self.index, self.workers, self.k = index, workers, 0

    def next(self) -> int:
        n = self.index + self.k * self.workers
        self.k += 1
        if self.end is None:
            return self.start + n
        return self.start + n % (self.end - self.start)


class Sequence:
    """One sequence in progress: its id and the requests left in it."""

    def __init__(self, options: SequenceOptions, ids: SequenceIds, rng: np.random.Generator) -> None:
        self.options, self.ids, self.rng = options, ids, rng
        self.id, self.left, self.length = 0, 0, 0

    def flags(self) -> tuple[int, bool, bool]:
        """(id, start, end) for the next request, beginning a new sequence when one ends."""
        if self.left == 0:
            spread = self.options.length * self.options.variation_pct / 100.0
            self.length = max(1, int(round(self.rng.uniform(self.options.length - spread,
                                                            self.options.length + spread))))
            self.left = self.length
            self.id = self.ids.next()
        start = self.left == self.length
        self.left -= 1
        return self.id, start, self.left == 0


def worker_main(conn, config: WorkerConfig) -> None:  # type: ignore[no-untyped-def]
    """Process entry point (must stay importable without side effects: spawn imports this module)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controlling process handles Ctrl-C
    try:
        # The server's loop choice (uvloop where installed): the load client's own CPU comes out of
        # the cores the server under test shares.
        event_loop.run(_Worker(conn, config).serve(), event_loop.resolve())
    finally:
        conn.close()


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class _Worker:
    def __init__(self, conn, config: WorkerConfig) -> None:  # type: ignore[no-untyped-def]
        self.conn = conn
        self.config = config
        self.payloads = config.payloads
        self.next_payload = 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.codes: list[int] = []
        self.errors: dict[str, str] = {}
        self.sent = 0
        self.delayed = 0
        self.issued = 0  # open loop: schedule points sent so far
        self.scheduled_next: float | None = None  # open loop: when the next send is due (monotonic ns)
        self.rate = 0.0
        self.running = False
        self.remaining: int | None = None
        self.tasks: set[asyncio.Task] = set()
        self.inflight = 0
        self.freed: asyncio.Event | None = None
        self.gaps_ns: list[float] | None = None
        self.open_sequences: list[Sequence] = []

    # ----------------------------------------------------------------- control

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue = asyncio.Queue()
        fd = self.conn.fileno()

        def readable() -> None:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # the controller is gone
                loop.remove_reader(fd)
                msg = ("exit",)
            commands.put_nowait(msg)

        loop.add_reader(fd, readable)
        self.freed = asyncio.Event()
        cfg = self.config
        if cfg.protocol == "http":
            self.transport: GrpcTransport | HttpTransport = HttpTransport(cfg.url, cfg.infer_path, cfg.tls, cfg.headers)
        else:
            self.transport = GrpcTransport(cfg.url, cfg.tls, cfg.headers, cfg.streaming, cfg.index)
        self.sequence_ids = SequenceIds(cfg.sequence, cfg.index, cfg.workers) if cfg.sequence else None
        self.sequence_rng = np.random.default_rng(cfg.seed + 7919 * (cfg.index + 1))
        try:
            await self.transport.connect(cfg.connect_timeout)
            self._reply(("ready",))
        except (asyncio.TimeoutError, OSError, HttpStatusError, grpc.aio.AioRpcError) as exc:
            reason = "" if isinstance(exc, asyncio.TimeoutError) else f": {exc}"
            self._reply(("error", f"worker {cfg.index} could not connect to {cfg.url} "
                                  f"within {cfg.connect_timeout:g}s{reason}"))
            await self.transport.close()
            loop.remove_reader(fd)
            return
        try:
            while True:
                cmd, *args = await commands.get()
                if cmd == "closed":
                    self._start_closed(*args)
                    self._reply(("ok",))
                elif cmd == "open":
                    self._start_open(*args)
                    self._reply(("ok",))
                elif cmd == "drain":
                    self._reply(("records", self._take()))
                elif cmd == "stop":
                    await self._stop()
                    self._reply(("records", self._take()))
                elif cmd == "exit":
                    await self._stop()
                    self._reply(("bye",))
                    break
                else:
                    self._reply(("error", f"unknown command {cmd!r}"))
        finally:
            loop.remove_reader(fd)
            await self.transport.close()

    def _reply(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            pass

    def _take(self) -> dict:
        batch = {
            "start": np.array(self.starts, dtype=np.int64),
            "end": np.array(self.ends, dtype=np.int64),
            "code": np.array(self.codes, dtype=np.int32),
            "sent": self.sent,
            "delayed": self.delayed,
            "due": self._due(),
            "errors": dict(self.errors),
            "done": self.remaining == 0 and not self.tasks,
            "cpu_s": cpu_seconds(),
            "t_ns": time.monotonic_ns(),
        }
        self.starts, self.ends, self.codes = [], [], []
        return batch

    def _due(self) -> float:
        """Open loop: sends the schedule asked for up to now (sent + backlog); closed loop: sent."""
        if self.scheduled_next is None:
            return float(self.sent)
        behind_ns = max(0.0, time.monotonic_ns() - self.scheduled_next)
        return self.issued + behind_ns * self.rate / 1e9

    async def _stop(self) -> None:
        self.running = False
        self.scheduled_next = None
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=self.config.stop_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        self.tasks.clear()
        self.remaining = None

    def _track(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ----------------------------------------------------------------- one request

    def _payload(self):  # type: ignore[no-untyped-def]
        payloads = self.payloads
        if len(payloads) == 1:
            return payloads[0]
        p = payloads[self.next_payload % len(payloads)]
        self.next_payload += 1
        return p

    def _new_sequence(self) -> Sequence | None:
        if self.sequence_ids is None:
            return None
        assert self.config.sequence is not None
        return Sequence(self.config.sequence, self.sequence_ids, self.sequence_rng)

    def _with_sequence(self, payload, sequence: Sequence | None):  # type: ignore[no-untyped-def]
        if sequence is None:
            return payload
        return self.transport.with_sequence(payload, *sequence.flags())

    def _error(self, exc: BaseException) -> int:
        if isinstance(exc, (HttpStatusError, StreamError)):
            code, details = exc.code, exc.details
        elif isinstance(exc, grpc.aio.AioRpcError):
            code = exc.code().value[0]
            details = exc.details() or ""
            if details in ("", exc.code().name):  # no message from the server: say what gRPC knows
                details = f"{details} ({exc.debug_error_string()})"
        else:
            code = grpc.StatusCode.UNKNOWN.value[0]
            details = f"{type(exc).__name__}: {exc}"
        name = _CODE_NAMES.get(code, str(code))
        if name not in self.errors:
            self.errors[name] = details
        return code

    async def _request(self, payload, call) -> None:  # type: ignore[no-untyped-def]
        self.sent += 1
        t0 = time.monotonic_ns()
        try:
            await call(payload)
            code = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an RPC error; anything else is counted as UNKNOWN
            code = self._error(exc)
        self.starts.append(t0)
        self.ends.append(time.monotonic_ns())
        self.codes.append(code)

    # ----------------------------------------------------------------- closed loop

    def _start_closed(self, concurrency: int, count: int | None) -> None:
        self.running = True
        self.remaining = count
        for slot in range(concurrency):
            self._track(asyncio.create_task(self._slot(slot)))

    async def _slot(self, slot: int) -> None:
        request = self._request
        call = self.transport.caller(slot)
        sequence = self._new_sequence()
        while self.running:
            if self.remaining is not None:
                if self.remaining <= 0:
                    break
                self.remaining -= 1
            await request(self._with_sequence(self._payload(), sequence), call)

    # ----------------------------------------------------------------- open loop

    def _start_open(self, rate: float, distribution: str, offset_s: float, count: int | None,
                    max_inflight: int, seed: int, gaps_ns: list[float] | None = None) -> None:
        self.running = True
        self.remaining = count
        self.max_inflight = max_inflight
        self.rate = rate
        self.gaps_ns = gaps_ns
        self.open_sequences = [s for s in (self._new_sequence() for _ in range(
            self.config.sequence.count if self.config.sequence else 0)) if s is not None]
        self._track(asyncio.create_task(self._sender(rate, distribution, offset_s, seed)))

    def _open_payload(self):  # type: ignore[no-untyped-def]
        payload = self._payload()
        if not self.open_sequences:
            return payload
        sequence = self.open_sequences[self.issued % len(self.open_sequences)]
        return self._with_sequence(payload, sequence)

    async def _one(self, payload) -> None:  # type: ignore[no-untyped-def]
        try:
            await self._request(payload, self.transport.caller(0))
        finally:
            self.inflight -= 1
            assert self.freed is not None
            self.freed.set()

    async def _sender(self, rate: float, distribution: str, offset_s: float, seed: int) -> None:
        scheduled = time.monotonic_ns() + offset_s * 1e9
        self.scheduled_next = scheduled
        freed = self.freed
        assert freed is not None
        try:
            await self._send_loop(rate, distribution, seed, scheduled, freed)
        finally:
            self.scheduled_next = None

    async def _send_loop(self, rate: float, distribution: str, seed: int, scheduled: float,
                         freed: asyncio.Event) -> None:
        gap_ns = 1e9 / rate
        rng = np.random.default_rng(seed)
        gaps: list[float] = []
        while self.running:
            if self.remaining is not None:
                if self.remaining <= 0:
                    break
                self.remaining -= 1
            now = time.monotonic_ns()
            if scheduled > now:
                await asyncio.sleep((scheduled - now) / 1e9)
                if not self.running:
                    break
            while self.inflight >= self.max_inflight:
                freed.clear()
                await freed.wait()
            if time.monotonic_ns() - scheduled > DELAY_THRESHOLD_NS:
                self.delayed += 1
            self.inflight += 1
            self.issued += 1
            self._track(asyncio.create_task(self._one(self._open_payload())))
            if distribution == "intervals":
                assert self.gaps_ns
                scheduled += self.gaps_ns[(self.issued - 1) % len(self.gaps_ns)]
            elif distribution == "poisson":
                if not gaps:
                    gaps = rng.exponential(gap_ns, size=4096).tolist()
                scheduled += gaps.pop()
            else:
                scheduled += gap_ns
            self.scheduled_next = scheduled
