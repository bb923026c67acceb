"""The messages between the core and a model host, and tensors laid out in their arenas.

A host holds one model instance. The core and the host speak over a framed
socket (:mod:`inferd.ipc.frames`: each message written at once) and two memfd
arenas, one per direction, each with one allocating side
(:mod:`inferd.ipc.arena`): *to the host* (the core writes a batch's inputs and
a BLS call's outputs, the host reads them in place) and *from the host* (the
host writes a batch's outputs, a decoupled response's and a BLS request's
tensors, the core reads them). A reader hands a block back when it is done with
it (:class:`Release` from the host, :class:`Free` from the core), so no lock
crosses the processes.

Each message is a msgspec Struct encoded as a msgpack array whose first item
is its tag (``array_like``): as small as a hand-built list, decoded straight
into its type in C, its fields read by name. Every message is built here, by its class; the
core's side is :mod:`inferd.hosts.instance`, the host's :mod:`inferd.hosts.runtime`.

Core -> host: :class:`Load` (first), :class:`Execute`, :class:`Cancel`,
:class:`Credit`, :class:`CallResult`, :class:`CallResponse`, :class:`Free`,
:class:`Ask`, :class:`Finalize`. Host -> core: :class:`Loaded`,
:class:`Result`, :class:`Response`, :class:`Call`, :class:`CallCancel`,
:class:`CallCredit`, :class:`Release`, :class:`Answer`, :class:`Ignoring`.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence, Union

import msgspec
import numpy as np

from inferd import errors
from inferd.dtypes import BY_NAME, decode_bytes, encode_bytes, from_numpy
from inferd.errors import InferdError
from inferd.ipc.arena import Arena, ArenaWriter, aligned

NO_BLOCK = -1
# How many responses of one decoupled request a host may send beyond those the core has
# credited back: the model's sender waits past it, so a client that reads slowly holds its model.
# The core credits them back CREDIT_EVERY at a time (each credit message wakes the host's loop).
RESPONSE_WINDOW = 16
CREDIT_EVERY = 8
# A message whose tensors hold at most this many bytes in all carries them itself: a block's
# allocation, its write and its release back (a message the other way) cost more than the copy.
INLINE_BYTES = 8192
# Read from-host blocks wait for the next batch to ride on; past this many they go in a Free of their own.
FREE_BATCH = 64
# The same for a BLS call into a decoupled model, in the other direction.
CALL_WINDOW = 16


class _Message(msgspec.Struct, array_like=True, tag=True, omit_defaults=False):
    pass


class TensorRef(msgspec.Struct, array_like=True):
    """A tensor: its wire datatype, shape, and where its bytes lie (BYTES: framed): in an arena at
    ``offset``, or, for a message's few bytes (at most INLINE_BYTES in all), in ``data``."""

    name: str
    datatype: str
    shape: list[int]
    offset: int
    nbytes: int
    data: bytes | None = None


class Failure(msgspec.Struct, array_like=True):
    """A domain error across the boundary: the name of an :mod:`inferd.errors` class and its message."""

    kind: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> "Failure":
        if isinstance(exc, InferdError):
            return cls(type(exc).__name__, exc.message)
        return cls("ModelExecutionError", f"{type(exc).__name__}: {exc}")

    def error(self) -> InferdError:
        kind = getattr(errors, self.kind, None)
        if isinstance(kind, type) and issubclass(kind, InferdError):
            return kind(self.message)
        return errors.ModelExecutionError(self.message)


# -- core -> host ----------------------------------------------------------------------------


class InstanceInfo(msgspec.Struct, array_like=True):
    """What the host needs to create the instance (an :class:`inferd.backends.InstanceSpec` less
    the in-process objects)."""

    name: str
    device_kind: str
    device_index: int
    model_dir: str
    version_dir: str
    version: int
    model_file: str
    threads: int
    group: int


class Load(_Message, tag=1):
    """Create the instance (the host's first message). ``spec``: the pickled ModelSpec."""

    backend: str
    spec: bytes
    instance: InstanceInfo
    session_cache: str | None
    log_level: int


class Row(msgspec.Struct, array_like=True):
    """One request of a batch. ``rid``: the core's number for it, unique among the host's open
    requests; ``stream``: it has a response sink (a decoupled model answers through it)."""

    rid: int
    id: str
    parameters: dict[str, Any]
    requested: list[str] | None
    correlation_id: int | str
    flags: int
    cancelled: bool
    stream: bool
    inputs: list[TensorRef]
    trace: str | None  # the request's W3C trace context (JSON), when it is traced


class Execute(_Message, tag=2):
    """Run one batch; its inputs lie in ``block`` of the to-host arena. ``free``: blocks of the from-host
    arena the core has read since its last message that carried them (a :class:`Free` of its own only
    when many wait)."""

    batch: int
    rows: list[Row]
    outputs: list[str]
    block: int
    free: list[int]


class Cancel(_Message, tag=3):
    """The request's client has gone: the model sees ``is_cancelled()``, its sender is closed."""

    rid: int


class Credit(_Message, tag=4):
    """The request's client has taken ``n`` more of its responses."""

    rid: int
    n: int


class CallResult(_Message, tag=5):
    """A control call's answer (load_model, unload_model, model_is_ready): its value, or why not."""

    cid: int
    value: Any
    failure: Failure | None


class CallResponse(_Message, tag=6):
    """One response to a BLS call (the only one of ``infer``; each of ``infer_stream``'s, the last
    ``final``), its tensors in ``block`` of the to-host arena; or the error."""

    cid: int
    final: bool
    model: str
    version: int
    id: str
    parameters: dict[str, Any]
    outputs: list[TensorRef]
    block: int
    failure: Failure | None


class Free(_Message, tag=7):
    """Blocks of the from-host arena the core no longer reads."""

    blocks: list[int]


class Ask(_Message, tag=8):
    """A question for the host: ``ready`` (the model's own is_ready), ``metrics`` (its custom metrics),
    ``footprint`` (its private memory in bytes, None where /proc cannot say)."""

    cid: int
    what: str


class Finalize(_Message, tag=9):
    """Unload: run the model's finalize and exit."""


# -- host -> core ----------------------------------------------------------------------------


class Loaded(_Message, tag=16):
    """The instance is created (or ``failure`` says why not). ``ready_check``: the model has an is_ready."""

    pid: int
    rss: int
    ready_check: bool
    failure: Failure | None


class Result(_Message, tag=17):
    """A batch's outcome: per row its outputs (in ``block`` of the from-host arena), or its error in
    ``failures`` (per row, when any row failed; else empty). ``times``: input, infer and output
    nanoseconds; ``release``: the batch's input block may be reused (False while a decoupled row
    still streams: a :class:`Release` follows); ``elements``: of padded inputs, the requests' own
    elements and the padding's (the padding-waste metrics)."""

    batch: int
    rows: list[list[TensorRef]]
    failures: list[Failure | None]
    block: int
    times: tuple[int, int, int]
    memory_delta: int | None
    reschedule: list[bool] | None
    release: bool
    elements: tuple[int, int] = (0, 0)


class Response(_Message, tag=18):
    """A decoupled request's response (its outputs in ``block``), error, or final flag alone."""

    rid: int
    final: bool
    outputs: list[TensorRef] | None
    block: int
    failure: Failure | None
    sent_ns: int


class BlsRequest(msgspec.Struct, array_like=True):
    """A BLS request's fields (its inputs in the call's block of the from-host arena)."""

    model: str
    version: int
    id: str
    parameters: dict[str, Any]
    requested: list[str] | None
    priority: int
    timeout_us: int
    inputs: list[TensorRef]
    parent: int  # the rid of the request whose trace it is part of (trace=request.trace()); -1: none


class Call(_Message, tag=19):
    """A call into the core's data plane: ``infer`` and ``infer_stream`` carry a BLS ``request``;
    ``load_model``, ``unload_model``, ``model_is_ready`` their ``args``."""

    cid: int
    method: str
    request: BlsRequest | None
    args: list[Any]
    block: int


class CallCancel(_Message, tag=20):
    """The model dropped a BLS stream (or its call): cancel it in the core."""

    cid: int


class CallCredit(_Message, tag=21):
    """The model has read ``n`` more responses of a BLS stream."""

    cid: int
    n: int


class Release(_Message, tag=22):
    """Blocks of the to-host arena the host no longer reads."""

    blocks: list[int]


class Answer(_Message, tag=23):
    """The answer to an :class:`Ask`."""

    cid: int
    value: Any
    failure: Failure | None


class Ignoring(_Message, tag=24):
    """The model kept sending for a request after its client had gone (its sender had raised):
    the core stops the host."""

    rid: int
    sends: int


ToHost = Union[Load, Execute, Cancel, Credit, CallResult, CallResponse, Free, Ask, Finalize]
FromHost = Union[Loaded, Result, Response, Call, CallCancel, CallCredit, Release, Answer, Ignoring]



_encoder = msgspec.msgpack.Encoder()
_to_host = msgspec.msgpack.Decoder(ToHost)
_from_host = msgspec.msgpack.Decoder(FromHost)


def encode(message: _Message) -> bytes:
    return _encoder.encode(message)


def to_host(data: bytes) -> ToHost:
    """A message the host received, as its type (msgspec.ValidationError if it is none)."""
    return _to_host.decode(data)  # type: ignore[no-any-return]


def from_host(data: bytes) -> FromHost:
    return _from_host.decode(data)  # type: ignore[no-any-return]


# -- tensors in an arena ---------------------------------------------------------------------


def _datatype(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    return from_numpy(array.dtype).name


def write_tensors(writer: ArenaWriter, groups: Sequence[dict[str, Any]],
                  lock: threading.Lock | None = None) -> tuple[int, list[list[TensorRef]]]:
    """Every tensor of ``groups`` (dicts of name -> array), for one message: (the block of ``writer``'s
    arena they were written into, or NO_BLOCK when none was needed; each group's references). At most
    INLINE_BYTES in all travel in the references themselves. Raises ArenaFull."""
    parts: list[tuple[str, str, list[int], Any]] = []
    total = 0
    for group in groups:
        for name, value in group.items():
            array = np.asarray(value)
            datatype = _datatype(array)
            data = encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            parts.append((name, datatype, list(array.shape), data))
            total += aligned(len(data))
    if total <= INLINE_BYTES:
        block, offsets, inline = NO_BLOCK, [0] * len(parts), [bytes(p[3]) for p in parts]
    else:
        if lock is not None:
            with lock:
                block, offsets = writer.reserve([len(p[3]) for p in parts])
        else:
            block, offsets = writer.reserve([len(p[3]) for p in parts])
        write = writer.arena.write
        for (_, _, _, data), at in zip(parts, offsets):
            if len(data):
                write(at, data)
        inline = [None] * len(parts)
    refs: list[list[TensorRef]] = []
    i = 0
    for group in groups:
        refs.append([TensorRef(name, datatype, shape, offsets[i + k], len(data), inline[i + k])
                     for k, (name, datatype, shape, data) in enumerate(parts[i:i + len(group)])])
        i += len(group)
    return block, refs


def read_tensors(arena: Arena, refs: Sequence[TensorRef], where: str, copy: bool = False) -> dict[str, np.ndarray]:
    """The tensors ``refs`` name: read-only views in place (``copy``: arrays of their own, writable)."""
    out: dict[str, np.ndarray] = {}
    for ref in refs:
        dtype = BY_NAME[ref.datatype]
        count = 1
        for d in ref.shape:
            count *= d
        data = ref.data
        if dtype.name == "BYTES":
            raw = memoryview(data) if data is not None else arena.view(ref.offset, ref.nbytes)
            array = decode_bytes(raw, count, f"{where}: tensor '{ref.name}'")
        elif count == 0:
            array = np.empty(0, dtype=dtype.numpy)
        elif data is not None:
            array = np.frombuffer(bytearray(data) if copy else data, dtype=dtype.numpy, count=count)
        else:
            array = arena.array(dtype.numpy, ref.offset, count)
            if copy:
                array = array.copy()
        out[ref.name] = array.reshape(ref.shape)
    return out
