"""The control messages between a frontend worker and the core: one typed struct per kind.

Each message is a :class:`msgspec.Struct` declared here, and this module is the
whole protocol: a message is built by calling its class (by field name) and
read by field name; nothing else knows a position. On the wire each is a
msgpack array (``array_like``) whose first item is its kind (the struct's
``tag``), as compact as a hand-written list; a side decodes every message it
receives straight to its struct, in C (:data:`ToCore`, :data:`ToWorker`: the
tagged unions the two ends of :class:`~inferd.ipc.channel.Channel` decode),
and a message that does not fit its struct is refused as the frame arrives.
Only headers travel: tensor data lies in the sender's arena and a tensor is
named by its place there.

Frontend -> core::

    Hello(index, pid)                      0  the worker has bound its ports and serves
    Infer(rid, model, version, id, parameters, inputs, outputs, flags, deadline, trace, received,
          openai_prompt_tokens, frontend)
                                           1  a request
        rid         the frontend's request number, unique among its requests in flight
        version     the wire's version string ("" for the policy's choice)
        parameters  the request's parameters as plain values (dict) or None
        inputs      [InputTensor(name, datatype, shape, offset, nbytes, parameters), ...]
                    offset: in the frontend's input arena; NOT_IN_ARENA when the data is
                    in a client's system shared memory region (named in parameters)
        outputs     [OutputRequest(name, parameters), ...], or None for every output
        flags       STREAM: a stream request (decoupled models may answer many times); HTTP
        deadline    absolute CLOCK_MONOTONIC seconds (shared by every process) or None
        trace       the W3C trace context carrier ({"traceparent": ...}) or None
        received    when the frontend received the request: CLOCK_MONOTONIC nanoseconds (an int;
                    0: not stamped); the core counts the request's whole wait from it
        openai_prompt_tokens  set by the /v1 layer only (None: not a /v1 request)
        frontend    only while tracing is on, for a unary gRPC / HTTP request:
                    FrontendStamp(protocol, decoded_ns) ("grpc" | "http", CLOCK_MONOTONIC ns when
                    it was decoded): Triton's frontend trace timestamps; the frontend then sends
                    Sent once it has answered; None otherwise
    Cancel(rid, ended)                     2  the client went away (ended: a stream's consumer stopped on
                                              purpose: a success); the core answers it anyway
    Free(blocks)                           3  output blocks the frontend is done reading
    Call(cid, method, payload)             4  a control-plane call (metadata, statistics, a forwarded
                                              RPC or HTTP route); payload: pickle of (args, kwargs),
                                              between our own two processes, never per inference
    Credit(rid, n)                         5  a stream's client has taken n more of its responses
    Sent(rid, start, end)                  6  that request's answer was sent between these moments
                                              (CLOCK_MONOTONIC ns; None: it never was)
    Refused(n)                             7  the frontend refused n more requests itself for overload
                                              (past --max-queued-requests in flight, a full input arena):
                                              the core counts them with its own
                                              (inferd_server_overload_rejected_total)

Core -> frontend::

    Config(options)                        16 the first message: what the worker serves (plain data)
    Response(rid, final, model, version, id, outputs, parameters, block)
                                           17 an answer
        outputs     [OutputTensor(name, datatype, shape, offset, nbytes), ...] in the frontend's
                    output arena (NOT_IN_ARENA: written to the client's shared memory region)
        block       the output block to Free once read (NO_BLOCK when none)
    Error(rid, final, kind, message)       18 kind: the name of an inferd.errors class
    Final(rid)                             19 a decoupled request ended after its last response
    Reply(cid, value, kind, message)       20 value: the pickled result; None when the call failed
                                              (kind: an inferd.errors class name, and its message)
    Drain(grace)                           21 stop taking requests (not ready), answer those accepted
    State(tracing)                         22 pushed when it changes
    Close()                                23 every worker's accepted requests are answered: close the
                                              ports and exit (until then an idle worker keeps its
                                              ports answering, as the one-process server does)
    Recycle(grace)                         24 this worker is replaced (its memory passed the bound; the
                                              replacement already serves): close the ports, serve every
                                              call taken, exit (inferd.serve.recycling)

A stream request's responses are paced by credit: the core sends at most
STREAM_WINDOW responses of one stream beyond those the frontend has credited
back (its final message is never held), and the frontend credits them back
CREDIT_EVERY at a time as its client takes them. A client that reads slowly so
holds its model back instead of filling the frontend or the arenas.

A request's input block is the frontend's until the core's final message for
it (Response/Error with ``final`` set, or Final): the core reads the inputs in
place until then, and never after.

The structs are not tracked by the garbage collector (``gc=False``): a message
holds plain values and containers of them, never a cycle, so building and
decoding one adds nothing for the collector to walk.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import numpy as np

from inferd.dtypes import BY_NAME, from_numpy
from inferd.facade import OPENAI_BATCH_CALLS

NOT_IN_ARENA = -1
NO_BLOCK = -1

# stream pacing (see above): STREAM_WINDOW must exceed CREDIT_EVERY, or a stream would stall
STREAM_WINDOW = 64
CREDIT_EVERY = 16

# Infer flags
STREAM = 1  # a stream request: a decoupled model may answer many times
HTTP = 2  # from the HTTP frontend (refusals of decoupled models use its words)

# The methods a Call may name: the façade's control-plane methods (inferd.facade.DataPlaneAPI but
# infer and infer_stream) and OpenAI's Batch API (inferd.facade.OpenAIBatchAPI), answered by the
# core's DataPlane; the core refuses any other name.
CALLS = frozenset({
    "server_live", "server_ready", "model_ready", "server_metadata", "model_metadata", "model_config",
    "model_statistics", "repository_index", "openai_models", "load_model", "unload_model", "shm_register", "shm_status",
    "shm_unregister", "cuda_shm_register", "cuda_shm_status", "cuda_shm_unregister", "trace_settings",
    "log_settings", "batch_submit", "batch_list", "batch_status", "batch_cancel", "batch_results",
    "kv_cache_blocks",
}) | OPENAI_BATCH_CALLS  # a worker's /v1 routes call OpenAI's Batch API, which the core's batches serve


class _Part(msgspec.Struct, array_like=True, gc=False):
    """A message's part, or (with a ``tag``) a message: a msgpack array on the wire."""


# -- the parts of an Infer and a Response ------------------------------------------------

class InputTensor(_Part):
    """An Infer's input: its bytes at ``offset`` (``nbytes`` long) in the frontend's input arena,
    or NOT_IN_ARENA with the client's shared memory region named in ``parameters``."""

    name: str
    datatype: str
    shape: list[int]
    offset: int
    nbytes: int
    parameters: dict[str, Any] | None


class OutputRequest(_Part):
    """An output the request asks for, with its parameters (classification, shared memory) or None."""

    name: str
    parameters: dict[str, Any] | None


class OutputTensor(_Part):
    """A Response's output: its bytes at ``offset`` in the frontend's output arena, or NOT_IN_ARENA
    when it was written to the client's shared memory region (then ``nbytes`` is 0)."""

    name: str
    datatype: str
    shape: list[int]
    offset: int
    nbytes: int


class FrontendStamp(_Part):
    """A traced unary request's frontend: "grpc" | "http", and when it was decoded (CLOCK_MONOTONIC ns)."""

    protocol: str
    decoded_ns: int


# -- frontend -> core -----------------------------------------------------------------------

class Hello(_Part, tag=0):
    index: int
    pid: int


class Infer(_Part, tag=1):
    rid: int
    model: str
    version: str
    id: str
    parameters: dict[str, Any] | None
    inputs: list[InputTensor]
    outputs: list[OutputRequest] | None
    flags: int
    deadline: float | None
    trace: dict[str, str] | None
    received: int
    openai_prompt_tokens: int | None
    frontend: FrontendStamp | None


class Cancel(_Part, tag=2):
    rid: int
    ended: bool = False  # a stream's consumer stopped on purpose: the request counts a success


class Free(_Part, tag=3):
    blocks: list[int]


class Call(_Part, tag=4):
    cid: int
    method: str
    payload: bytes


class Credit(_Part, tag=5):
    rid: int
    n: int


class Sent(_Part, tag=6):
    rid: int
    start: int | None
    end: int | None


class Refused(_Part, tag=7):
    n: int


# -- core -> frontend -----------------------------------------------------------------------

class Config(_Part, tag=16):
    options: dict[str, Any]


class Response(_Part, tag=17):
    rid: int
    final: bool
    model: str
    version: int
    id: str
    outputs: list[OutputTensor]
    parameters: dict[str, Any] | None
    block: int


class Error(_Part, tag=18):
    rid: int
    final: bool
    kind: str
    message: str


class Final(_Part, tag=19):
    rid: int
    final: ClassVar[bool] = True  # not a field: Final is always final (Response and Error say it in theirs)


class Reply(_Part, tag=20):
    cid: int
    value: bytes | None
    kind: str
    message: str


class Drain(_Part, tag=21):
    grace: float


class State(_Part, tag=22):
    tracing: bool


class Close(_Part, tag=23):
    pass


class Recycle(_Part, tag=24):
    grace: float


# What each end of the channel receives (its Channel decodes to these).
ToCore = Hello | Infer | Cancel | Free | Call | Credit | Sent | Refused
ToWorker = Config | Response | Error | Final | Reply | Drain | State | Close | Recycle
# The messages that answer an Infer; final: Response or Error with final set, and Final.
Answer = Response | Error | Final


_NUMPY_NAME = {t.numpy: t.name for t in BY_NAME.values() if t.numpy is not None}


def datatype_of(array: np.ndarray) -> str:
    """The datatype a tensor entry names for ``array`` (either side writing tensors into its arena)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    return _NUMPY_NAME.get(array.dtype) or from_numpy(array.dtype).name
