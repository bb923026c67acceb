"""The control messages between a frontend worker and the core.

Every message is a msgpack array whose first item is its kind. Only headers
travel: tensor data lies in the sender's arena and a tensor is named by its
place there. Positions, not keys, keep messages small and cheap to build;
the layouts below are the whole protocol.

Frontend -> core::

    [HELLO, index, pid]                    the worker has bound its ports and serves
    [INFER, rid, model, version, id, parameters, inputs, outputs, flags, deadline, trace, received(, frontend)]
        rid         the frontend's request number, unique among its requests in flight
        version     the wire's version string ("" for the policy's choice)
        parameters  the request's parameters as plain values (dict) or None
        inputs      [[name, datatype, shape, offset, nbytes, parameters], ...]
                    offset: in the frontend's input arena; NOT_IN_ARENA when the data is
                    in a client's system shared memory region (named in parameters)
        outputs     [[name, parameters], ...], or None for every output
        flags       STREAM: a stream request (decoupled models may answer many times)
        deadline    absolute CLOCK_MONOTONIC seconds (shared by every process) or None
        trace       the W3C trace context carrier ({"traceparent": ...}) or None
        received    when the frontend received the request: CLOCK_MONOTONIC nanoseconds (an int;
                    0: not stamped); the core counts the request's whole wait from it
        frontend    only while tracing is on, for a unary gRPC / HTTP request: [protocol, received_end]
                    ("grpc" | "http", CLOCK_MONOTONIC ns when it was decoded): Triton's frontend
                    trace timestamps; the frontend then sends SENT once it has answered
    [SENT, rid, start, end]                that request's answer was sent between these moments
                                           (CLOCK_MONOTONIC ns; None: it never was)
    [CANCEL, rid(, ended)]                 the client went away (ended: a stream's consumer stopped on
                                           purpose: a success); the core answers it anyway
    [CREDIT, rid, n]                       a stream's client has taken n more of its responses
    [FREE, [block, ...]]                   output blocks the frontend is done reading
    [REFUSED, n]                           the frontend refused n more requests itself for overload (its
                                           share of --max-queued-requests, a full input arena): the core
                                           counts them with its own (inferd_server_overload_rejected_total)
    [CALL, cid, method, payload]           a control-plane call (metadata, statistics, a forwarded
                                           RPC or HTTP route); payload: pickle of (args, kwargs),
                                           between our own two processes, never per inference

Core -> frontend::

    [CONFIG, options]                      the first message: what the worker serves
    [RESPONSE, rid, final, model, version, id, outputs, parameters, block]
        outputs     [[name, datatype, shape, offset, nbytes], ...] in the frontend's output
                    arena (NOT_IN_ARENA: written to the client's shared memory region)
        block       the output block to FREE once read (NO_BLOCK when none)
    [ERROR, rid, final, kind, message]     kind: the name of an inferd.errors class
    [FINAL, rid]                           a decoupled request ended after its last response
    [REPLY, cid, ok, value]                value: the pickled result, or [kind, message] when not ok
    [STATE, {"tracing": bool}]             pushed when it changes
    [DRAIN, grace_seconds]                 stop taking requests (not ready), answer those accepted
    [CLOSE]                                every worker's accepted requests are answered: close the
                                           ports and exit (until then an idle worker keeps its
                                           ports answering, as the one-process server does)
    [RECYCLE, grace_seconds]               this worker is replaced (its memory passed the bound; the
                                           replacement already serves): close the ports, serve every
                                           call taken, exit (inferd.serve.recycling)

A stream request's responses are paced by credit: the core sends at most
STREAM_WINDOW responses of one stream beyond those the frontend has credited
back (its final message is never held), and the frontend credits them back
CREDIT_EVERY at a time as its client takes them. A client that reads slowly so
holds its model back instead of filling the frontend or the arenas.

A request's input block is the frontend's until the core's final message for
it (RESPONSE/ERROR with final set, or FINAL): the core reads the inputs in
place until then, and never after.
"""

from __future__ import annotations

import numpy as np

from inferd.dtypes import BY_NAME, from_numpy

# frontend -> core
HELLO = 0
INFER = 1
CANCEL = 2
FREE = 3
CALL = 4
CREDIT = 5
SENT = 6
REFUSED = 7
# core -> frontend
CONFIG = 16
RESPONSE = 17
ERROR = 18
FINAL = 19
REPLY = 20
DRAIN = 21
STATE = 22
CLOSE = 23
RECYCLE = 24

NOT_IN_ARENA = -1
NO_BLOCK = -1

# stream pacing (see above): STREAM_WINDOW must exceed CREDIT_EVERY, or a stream would stall
STREAM_WINDOW = 64
CREDIT_EVERY = 16

# INFER flags
STREAM = 1  # a stream request: a decoupled model may answer many times
HTTP = 2  # from the HTTP frontend (refusals of decoupled models use its words)

# The methods a CALL may name: the façade's control-plane methods (inferd.facade.DataPlaneAPI but
# infer and infer_stream), answered by the core's DataPlane; the core refuses any other name.
CALLS = frozenset({
    "server_live", "server_ready", "model_ready", "server_metadata", "model_metadata", "model_config",
    "model_statistics", "repository_index", "openai_models", "load_model", "unload_model", "shm_register", "shm_status",
    "shm_unregister", "cuda_shm_register", "cuda_shm_status", "cuda_shm_unregister", "trace_settings",
    "log_settings", "batch_submit", "batch_list", "batch_status", "batch_cancel", "batch_results",
    "kv_cache_blocks",
})

# positions in an INFER message
I_RID, I_MODEL, I_VERSION, I_ID, I_PARAMS, I_INPUTS, I_OUTPUTS, I_FLAGS, I_DEADLINE, I_TRACE, I_RECEIVED, I_OPENAI = (
    range(1, 13))
I_FRONTEND = 13  # present only while tracing is on
# positions in a tensor entry
T_NAME, T_DATATYPE, T_SHAPE, T_OFFSET, T_NBYTES, T_PARAMS = range(6)
# positions in a RESPONSE message
R_RID, R_FINAL, R_MODEL, R_VERSION, R_ID, R_OUTPUTS, R_PARAMS, R_BLOCK = range(1, 9)


def infer(rid: int, model: str, version: str, request_id: str, parameters: dict | None, inputs: list,
          outputs: list | None, flags: int = 0, deadline: float | None = None,
          trace: dict | None = None, received_ns: int = 0, openai_prompt_tokens: int | None = None) -> list:
    return [INFER, rid, model, version, request_id, parameters, inputs, outputs, flags, deadline, trace, received_ns,
            openai_prompt_tokens]


def response(rid: int, final: bool, model: str, version: int, request_id: str, outputs: list,
             parameters: dict | None, block: int) -> list:
    return [RESPONSE, rid, final, model, version, request_id, outputs, parameters, block]


def error(rid: int, final: bool, kind: str, message: str) -> list:
    return [ERROR, rid, final, kind, message]


def call(cid: int, method: str, args: list) -> list:
    return [CALL, cid, method, args]


def reply(cid: int, ok: bool, value: object) -> list:
    return [REPLY, cid, ok, value]


_NUMPY_NAME = {t.numpy: t.name for t in BY_NAME.values() if t.numpy is not None}


def datatype_of(array: np.ndarray) -> str:
    """The datatype a tensor entry names for ``array`` (either side writing tensors into its arena)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    return _NUMPY_NAME.get(array.dtype) or from_numpy(array.dtype).name
