"""The core's side of a hand-off message: INFER -> InferenceRequest, outputs -> RESPONSE.

Input tensors become numpy arrays *in place* in the frontend's input arena
(read-only views: the bytes were written once, by the frontend, and are never
copied again unless a model keeps them); outputs are written once into the
frontend's output arena, in one block per response.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferd.dtypes import BY_NAME, encode_bytes, from_numpy
from inferd.errors import InvalidArgument
from inferd.handoff import wire
from inferd.handoff.arena import Arena, ArenaWriter
from inferd.server import codec
from inferd.types import InferenceRequest, RequestedOutput, SharedTensor

_NUMPY_NAME = {t.numpy: t.name for t in BY_NAME.values() if t.numpy is not None}


def request_from(msg: list[Any], inputs: Arena) -> InferenceRequest:
    """The request an INFER message carries. Tensors in a client's system shared memory stay
    references (SharedTensor inputs, ShmRef outputs), resolved by the data plane."""
    model = msg[wire.I_MODEL]
    arrays: dict[str, Any] = {}
    shared = False
    for name, datatype, shape, offset, nbytes, params in msg[wire.I_INPUTS]:
        where = f"input '{name}' for model '{model}'"
        dtype, dims = codec.tensor_type(datatype, shape, where)
        if name in arrays:
            raise InvalidArgument(f"{where}: the input is given twice")
        if offset == wire.NOT_IN_ARENA:
            ref = codec.shm_ref(params, where)
            if ref is None:
                raise InvalidArgument(f"{where}: no data: neither in the request nor in shared memory")
            arrays[name] = SharedTensor(ref, dtype, dims)
            shared = True
        else:
            count = 1
            for d in dims:
                count *= d
            if dtype.name == "BYTES" or dtype.numpy is None or nbytes != count * dtype.itemsize:
                # BYTES (decoded from its framing), or a size or type the one-process codec refuses, in its words
                arrays[name] = codec.array_from_raw(inputs.view(offset, nbytes), dtype, dims, where)  # type: ignore[arg-type]
            else:
                arrays[name] = inputs.array(dtype.numpy, offset, count).reshape(dims)
    request = InferenceRequest(model_name=model, inputs=arrays,
                               model_version=codec.parse_version(model, msg[wire.I_VERSION]),
                               id=msg[wire.I_ID], deadline=msg[wire.I_DEADLINE], shared_memory=shared,
                               received_ns=msg[wire.I_RECEIVED])
    params = msg[wire.I_PARAMS]
    if params:
        request.parameters = params
        request.priority = codec.int_param(model, params, "priority")
        request.timeout_us = codec.int_param(model, params, "timeout")
    outputs = msg[wire.I_OUTPUTS]
    if outputs is not None:
        requested = []
        for name, oparams in outputs:
            r = RequestedOutput(name)
            if oparams:
                r.parameters = oparams
                r.class_count = codec.int_param(model, oparams, "classification")
                r.shared_memory = codec.shm_ref(oparams, f"output '{name}' for model '{model}'")
                if r.shared_memory is not None:
                    request.shared_memory = True
            requested.append(r)
        request.requested_outputs = requested
    return request


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    return _NUMPY_NAME.get(array.dtype) or from_numpy(array.dtype).name


def response_message(rid: int, final: bool, response: Any, requested: list[RequestedOutput] | None,
                     outputs: ArenaWriter) -> list[Any]:
    """A RESPONSE for an InferenceResponse; its tensors go into one new output block.
    Outputs requested into shared memory were written there already: they carry no data."""
    entries, block = _outputs_message(response.outputs, requested, outputs)
    return [wire.RESPONSE, rid, final, response.model_name, response.model_version, response.id, entries,
            response.parameters or None, block]


def run_message(rid: int, run: Any, outputs: ArenaWriter) -> list[Any]:
    """The final RESPONSE for a finished :class:`~inferd.model.ModelRun`."""
    request = run.request
    entries, block = _outputs_message(run.outputs, request.requested_outputs, outputs)
    model = run.model
    return [wire.RESPONSE, rid, True, model.spec.name, model.version, request.id, entries, None, block]


def _outputs_message(arrays: dict[str, np.ndarray], requested: list[RequestedOutput] | None,
                     outputs: ArenaWriter) -> tuple[list[list[Any]], int]:
    in_shm = {r.name for r in requested if r.shared_memory is not None} if requested else None
    entries: list[list[Any]] = []
    parts: list[Any] = []
    for name, array in arrays.items():
        datatype = datatype_of(array)
        if in_shm and name in in_shm:
            entries.append([name, datatype, list(array.shape), wire.NOT_IN_ARENA, 0])
            continue
        if datatype == "BYTES":
            data: Any = encode_bytes(array)
        else:
            # A flat uint8 view: numpy dtypes the buffer protocol cannot name (bfloat16) still copy.
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        entries.append([name, datatype, list(array.shape), None, len(data)])
        parts.append(data)
    block = wire.NO_BLOCK
    if parts:
        block, offsets = outputs.put(parts)
        i = 0
        for e in entries:
            if e[3] is None:
                e[3] = offsets[i]
                i += 1
    return entries, block
