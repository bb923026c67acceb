"""Triton's Python-backend utilities, for Python models that inferd serves.

Existing Triton Python models do ``import triton_python_backend_utils as
pb_utils`` and keep working unchanged: this module provides the same names
(:class:`Tensor`, :class:`InferenceRequest` including BLS's ``exec`` and
``async_exec``, :class:`InferenceResponse`, :class:`TritonError`,
:class:`TritonModelException`, :class:`Logger`, the ``auto_complete_config``
:class:`ModelConfig`, the ``get_*_by_name`` helpers and the type tables).

inferd runs a model in the server process, on its instance's worker thread,
so tensors are plain numpy arrays (always in CPU memory). A decoupled model
(``model_transaction_policy { decoupled: true }``) answers through
``request.get_response_sender()`` (:class:`InferenceResponseSender`). A BLS
call with ``decoupled=True`` returns a :class:`ResponseIterator`; custom
metrics are :class:`MetricFamily` / :class:`Metric`. docs/PYTHON_BACKEND.md
lists the whole API and where inferd stands on each entry.
"""

from __future__ import annotations

import json
import logging
import struct
import sys
import threading
from typing import Any, Iterable, Sequence

import numpy as np

try:  # numpy has no bfloat16 of its own; inferd carries BF16 as ml_dtypes.bfloat16
    import ml_dtypes

    _BF16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    _BF16 = None

__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "LogLevel", "Logger", "ModelConfig", "Tensor", "TritonError",
    "TritonModelException", "deserialize_bytes_tensor", "get_input_config_by_name", "get_input_tensor_by_name",
    "get_output_config_by_name", "get_output_tensor_by_name", "numpy_to_triton_type", "serialize_byte_tensor",
    "triton_string_to_numpy", "triton_to_numpy_type", "using_decoupled_model_transaction_policy",
    "InferenceTrace", "MetricFamily", "Metric", "ResponseIterator", "get_model_dir", "is_model_ready", "load_model", "unload_model",
]

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
if _BF16 is not None:
    TRITON_STRING_TO_NUMPY["TYPE_BF16"] = _BF16.type

# TRITONSERVER_DataType codes, as Tensor.triton_dtype() reports them.
_CODE_TO_NUMPY: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}
if _BF16 is not None:
    _CODE_TO_NUMPY[14] = _BF16.type
_NUMPY_TO_CODE: dict[Any, int] = {np.dtype(v): k for k, v in _CODE_TO_NUMPY.items()}
_NUMPY_TO_CODE[np.dtype(np.bytes_)] = 13

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class PreferredMemory:
    """Where a BLS call would like its outputs (``InferenceRequest(preferred_memory=...)``).
    A preference, as in Triton: inferd's BLS outputs are always numpy arrays in CPU memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (``TYPE_STRING`` -> ``np.object_``)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _CODE_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    try:
        return _NUMPY_TO_CODE.get(np.dtype(data_type))
    except TypeError:
        return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """BYTES elements as the protocol frames them: 4-byte little-endian length, then the bytes."""
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of ``bytes``."""
    items = []
    view = memoryview(encoded_tensor)
    pos = 0
    while pos < len(view):
        (length,) = struct.unpack_from("<I", view, pos)
        pos += 4
        items.append(bytes(view[pos:pos + length]))
        pos += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


# -- errors ----------------------------------------------------------------------


class TritonError:
    """An error a model reports in an :class:`InferenceResponse` (or BLS reports to it)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by models (and by this module) to fail the requests of an execution."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg

    def __str__(self) -> str:
        return self._msg


# -- tensors ---------------------------------------------------------------------


class Tensor:
    """A named tensor of a request or response; the data is a numpy array."""

    __slots__ = ("_name", "_array", "_shared")

    def __init__(self, name: str, numpy_array: np.ndarray, triton_dtype: int | None = None) -> None:
        if not isinstance(numpy_array, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}': numpy_array must be a numpy.ndarray, got {type(numpy_array).__name__}"
            )
        if numpy_array.dtype.type == np.str_ or (numpy_array.dtype.kind == "V" and numpy_array.dtype != _BF16):
            raise TritonModelException(
                f"Tensor '{name}': dtype {numpy_array.dtype} is not supported by the Python backend; "
                "use np.object_ (of bytes or str) for BYTES tensors"
            )
        if triton_dtype is not None:
            wanted = triton_to_numpy_type(triton_dtype)
            if wanted is not None and numpy_array.dtype != np.dtype(wanted):
                numpy_array = numpy_array.view(wanted)  # reinterpret the bytes, as Triton does
        self._name = name
        self._array = numpy_array
        self._shared = False

    @classmethod
    def _of_request(cls, name: str, array: np.ndarray) -> "Tensor":
        # A request's input as the server decoded it: the array may be a
        # read-only view of the request's bytes; as_numpy() hands out a
        # writable copy the first time (Triton's arrays are writable).
        t = cls.__new__(cls)
        t._name = name
        t._array = array
        t._shared = not array.flags.writeable
        return t

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._shared:
            self._array = self._array.copy()
            self._shared = False
        return self._array

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    # DLPack: through torch where it is installed (it handles BF16 and
    # capsules), otherwise numpy's own support.

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        array = self._array
        if array.dtype.kind == "O":
            raise TritonModelException(f"Tensor '{self._name}': BYTES tensors cannot be shared through DLPack")
        if not array.flags.writeable:
            array = array.copy()  # the consumer may write into it
        try:
            import torch
            from torch.utils import dlpack as torch_dlpack
        except ImportError:
            return array.__dlpack__()
        if _BF16 is not None and array.dtype == _BF16:
            tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        return torch_dlpack.to_dlpack(tensor)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> "Tensor":
        """A Tensor from a DLPack capsule or an object with ``__dlpack__`` (a torch tensor, say)."""
        try:
            import torch
        except ImportError:
            return Tensor(name, np.from_dlpack(dlpack))
        tensor = torch.from_dlpack(dlpack)
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:
            if _BF16 is None:  # pragma: no cover
                raise TritonModelException(f"Tensor '{name}': bfloat16 needs the ml_dtypes package")
            return Tensor(name, tensor.view(torch.int16).numpy().view(_BF16))
        return Tensor(name, tensor.numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


# -- requests and responses ----------------------------------------------------------


class InferenceResponse:
    """One response: output tensors, or an error."""

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | None = None,
                 parameters: Any = None) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list.')
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        p = self._parameters
        return p if isinstance(p, str) else json.dumps(p or {})


class InferenceResponseSender:
    """A decoupled model's way to answer one request: ``send`` any number of
    responses, from any thread and at any time (also after ``execute``
    returned), then the final flag, on the last response or alone::

        sender = request.get_response_sender()
        for i in range(n):
            sender.send(pb_utils.InferenceResponse(output_tensors=[...]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    Responses reach the client in the order they are sent. Once the request's client has
    gone (``is_cancelled()``), a response can no longer be delivered: during the ``execute``
    call that holds the request it is dropped (the batch's other requests go on), after it
    ``send`` raises, as on a closed sender; the final flag, alone or on an error response,
    closes the sender quietly (the usual end of a cancelled request). A model that keeps
    sending for a cancelled request is stopped with its model host.
    """

    def __init__(self, deliver: Any, request: "InferenceRequest | None" = None, on_refused: Any = None) -> None:
        self._deliver = deliver  # deliver(response or None, final: bool), set by inferd
        self._request = request
        self._lock = threading.Lock()
        self._closed = False
        self._refused = 0  # sends refused after the client had gone
        self._on_refused = on_refused  # on_refused(count), set by inferd (a model host reports a model ignoring it)
        self._in_execute = False  # set by inferd while the execute call holding the request runs

    def send(self, response: "InferenceResponse | None" = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException("Inference Response object is needed when the flags is not FINAL.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}")
        with self._lock:  # concurrent senders: one at a time, in order
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if self.is_cancelled():
                if final or (response is not None and response.has_error()):
                    self._closed = True  # a cancelled request's end: nothing to deliver
                    return
                self._refused += 1
                if self._on_refused is not None:
                    self._on_refused(self._refused)
                if self._in_execute:
                    return  # dropped: raising would fail the batch's other requests too
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._request is not None and self._request.is_cancelled()

    def _close(self) -> bool:
        """Close the sender (inferd: the execution failed); True if it was open."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open


class InferenceTrace:
    """A request's trace (``request.trace()``), to hand to a BLS request (``InferenceRequest(...,
    trace=request.trace())``) so the call is traced as part of it; empty when the request is not
    traced. ``get_context()``: its W3C trace context as a JSON string (``{"traceparent": ...}``),
    or None when not traced."""

    def __init__(self, _trace: Any = None) -> None:
        self._trace = _trace  # inferd's RequestTrace of the request, or None

    def get_context(self) -> str | None:
        if self._trace is None:
            return None
        from inferd.observability.tracing import trace_context

        return trace_context(self._trace)


class InferenceRequest:
    """A request to this model (``execute`` receives a list of them), or a
    BLS request to another model built by the model itself::

        request = pb_utils.InferenceRequest(
            model_name="other", inputs=[pb_utils.Tensor("INPUT0", array)],
            requested_output_names=["OUTPUT0"])
        response = request.exec()          # or: await request.async_exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())

    BLS requests go through inferd's own data plane, so they are scheduled
    (and dynamically batched) with the callee's other traffic.
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] | None = None,
        requested_output_names: Sequence[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        # Triton's binding takes a std::string, so a BYTES element (bytes) is a name too.
        self.model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self.model_version = model_version
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters: dict[str, Any] = dict(parameters or {})
        self._cancelled: Any = None  # the server's request, for is_cancelled()
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        if trace is not None and not isinstance(trace, InferenceTrace):
            raise TritonModelException(
                f"InferenceRequest: trace must be a pb_utils.InferenceTrace (request.trace()), got {type(trace).__name__}")
        self._trace = trace if trace is not None else InferenceTrace()

    @classmethod
    def _of_server(cls, inputs: list[Tensor], request_id: str, requested: list[str],
                   parameters: dict[str, Any], source: Any) -> "InferenceRequest":
        r = cls.__new__(cls)
        r._request_id = request_id
        r._correlation_id = 0
        r._inputs = inputs
        r._requested = requested
        r.model_name = ""
        r.model_version = -1
        r._flags = 0
        r._timeout = 0
        r._parameters = parameters
        r._cancelled = source
        r._sender = None
        r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        r._trace = InferenceTrace(getattr(source, "trace", None))
        if source is not None:
            r._correlation_id = getattr(source, "correlation_id", 0)
            r._flags = getattr(source, "flags", 0)
        return r

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        """A BLS request's sequence flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END)."""
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def trace(self) -> InferenceTrace:
        """This request's trace: give it to a BLS request (``trace=``) to trace the call with it."""
        return self._trace

    def parameters(self) -> str:
        """The request's parameters as a JSON string (as Triton gives them)."""
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        source = self._cancelled
        return bool(source is not None and getattr(source, "cancelled", False))

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: run this request again at
        the next step (``sequence_batching { iterative_sequence: true }`` only);
        ``TRITONSERVER_REQUEST_RELEASE_ALL`` (the default): it is done."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(
                f"set_release_flags: flags must be TRITONSERVER_REQUEST_RELEASE_ALL ({TRITONSERVER_REQUEST_RELEASE_ALL}) "
                f"or TRITONSERVER_REQUEST_RELEASE_RESCHEDULE ({TRITONSERVER_REQUEST_RELEASE_RESCHEDULE}), got {flags!r}")
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender(): only a decoupled model (model_transaction_policy { decoupled: true }) "
                "answers through a response sender in inferd; return one InferenceResponse per request from "
                "execute()"
            )
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the named model and wait for its response (BLS); with
        ``decoupled=True``, a :class:`ResponseIterator` over all its responses (the last
        one final, maybe empty), for a decoupled callee or any other."""
        from inferd.backends.python import bls_exec, bls_stream

        if decoupled:
            return bls_stream(self, sys._getframe(1).f_globals)
        return bls_exec(self, sys._getframe(1).f_globals)

    def async_exec(self, decoupled: bool = False) -> Any:
        """Start this request on the named model; returns an awaitable for its response
        (``decoupled=True``: for a :class:`ResponseIterator`, once its first response is
        there). Use from ``async def execute``."""
        from inferd.backends.python import bls_async_exec, bls_async_stream

        if decoupled:
            return bls_async_stream(self, sys._getframe(1).f_globals)
        return bls_async_exec(self, sys._getframe(1).f_globals)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for t in model_config.get("input", []):
        if t["name"] == name:
            return t
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for t in model_config.get("output", []):
        if t["name"] == name:
            return t
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# -- auto-complete ---------------------------------------------------------------------


class ModelConfig:
    """What ``TritonPythonModel.auto_complete_config`` receives and returns.

    Only the inputs, outputs, max_batch_size and dynamic batching can be
    completed; a value that contradicts one the config sets is refused with
    ValueError, as in Triton.
    """

    def __init__(self, model_config: str | dict) -> None:
        self._model_config = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 0:
            raise ValueError(
                f"set_max_batch_size for model '{self._name}': max_batch_size must be an integer >= 0, "
                f"got {max_batch_size!r}"
            )
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for "
                f"model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config function "
                    f"for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name}' "
                    "contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: dict, allowed: Iterable[str]) -> None:
        if not isinstance(tensor, dict):
            raise ValueError(f"add_{kind} for model '{self._name}': expected a dict, got {type(tensor).__name__}")
        allowed = tuple(allowed)
        label = f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for model '{self._name}'"
        for key in tensor:
            if key not in allowed:
                raise ValueError(f"{label} contains property '{key}'; allowed: {', '.join(allowed)}")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{label} is missing '{key}' property.")
        dims = [int(d) for d in tensor["dims"]]
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            have_type = current.get("data_type", "TYPE_INVALID")
            if have_type not in ("TYPE_INVALID", "") and have_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype {have_type} for "
                    f"{kind} '{tensor['name']}', model provides {tensor['data_type']}"
                )
            have_dims = [int(d) for d in current.get("dims", [])]
            if have_dims and have_dims != dims:
                raise ValueError(
                    f"model '{self._name}', tensor '{tensor['name']}': the model expects dims {dims} but the "
                    f"model configuration specifies dims {have_dims}"
                )
            if "optional" in tensor and "optional" in current and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{self._name}', tensor '{tensor['name']}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = dims
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        added = dict(tensor)
        added["dims"] = dims
        self._model_config[kind].append(added)


# -- logging -------------------------------------------------------------------------

_log = logging.getLogger("inferd.python_model")
_context = threading.local()  # the model running on this thread, set by inferd


def _set_current_model(name: str | None, model_dir: str | None = None) -> None:
    _context.model = name
    _context.model_dir = model_dir


def get_model_dir() -> str:
    """The folder of the running model's ``model.py`` (its version folder), as Triton's stub
    gives it; from a thread the model started, the folder of the calling code's file."""
    found = getattr(_context, "model_dir", None)
    if found:
        return found
    caller = sys._getframe(1).f_globals.get("__file__")
    if caller:
        import os

        return os.path.dirname(os.path.abspath(caller))
    raise TritonModelException("get_model_dir() is only available to a model's own code")


class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
           LogLevel.VERBOSE: logging.DEBUG}


class Logger:
    """Model logging into the server's log, prefixed with the model's name."""

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        model = getattr(_context, "model", None)
        _log.log(_LEVELS.get(level, logging.INFO), "%s%s", f"[{model}] " if model else "", message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)


# -- the model loading API -----------------------------------------------------------------


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` from the model repository; ``config``: a JSON model config
    used instead of its config.pbtxt; ``files`` (``"file:<path>"`` -> bytes, with ``config``): the
    folder to load it from instead. Returns once it serves; raises TritonModelException why not.
    Explicit (and on_demand) model control mode only, as RepositoryModelLoad."""
    from inferd.backends.python import load_model as load

    load(model_name, config, files, sys._getframe(1).f_globals)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload every version of ``model_name`` (``unload_dependents``: the ensembles that use it
    too): new requests are refused once it returns, accepted ones finish."""
    from inferd.backends.python import unload_model as unload

    unload(model_name, unload_dependents, sys._getframe(1).f_globals)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (version ``model_version``, a string; "" = as its policy chooses)
    is loaded and serving."""
    from inferd.backends.python import is_model_ready as ready

    return ready(model_name, model_version, sys._getframe(1).f_globals)


from triton_python_backend_utils._metrics import Metric, MetricFamily  # noqa: E402  (they raise TritonModelException)
from triton_python_backend_utils._responses import ResponseIterator  # noqa: E402
