"""Tensor data types: the protocol's names, the config's enum, numpy and ONNX.

The protocol names a type by string (``"FP32"``), the model config by enum
(``TYPE_FP32``), numpy by dtype and ONNX Runtime by ``"tensor(float)"``. This
module is the one place that knows all four, and the protocol's framing of
BYTES elements (4-byte little-endian length, then the bytes). BYTES tensors are numpy object
arrays of ``bytes``; BF16 tensors are ``ml_dtypes.bfloat16`` arrays.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from inferd.errors import InvalidArgument

try:  # onnx depends on ml_dtypes, so it is normally present
    import ml_dtypes

    _BF16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    _BF16 = None


@dataclass(frozen=True, slots=True)
class DataType:
    name: str  # wire name, e.g. "FP32"
    config: str  # config enum name, e.g. "TYPE_FP32"
    onnx: str  # onnxruntime type string
    numpy: np.dtype | None  # None only for BF16 without ml_dtypes
    itemsize: int  # bytes per element; 0 for BYTES (variable)


_TYPES = [
    DataType("BOOL", "TYPE_BOOL", "tensor(bool)", np.dtype(np.bool_), 1),
    DataType("UINT8", "TYPE_UINT8", "tensor(uint8)", np.dtype(np.uint8), 1),
    DataType("UINT16", "TYPE_UINT16", "tensor(uint16)", np.dtype(np.uint16), 2),
    DataType("UINT32", "TYPE_UINT32", "tensor(uint32)", np.dtype(np.uint32), 4),
    DataType("UINT64", "TYPE_UINT64", "tensor(uint64)", np.dtype(np.uint64), 8),
    DataType("INT8", "TYPE_INT8", "tensor(int8)", np.dtype(np.int8), 1),
    DataType("INT16", "TYPE_INT16", "tensor(int16)", np.dtype(np.int16), 2),
    DataType("INT32", "TYPE_INT32", "tensor(int32)", np.dtype(np.int32), 4),
    DataType("INT64", "TYPE_INT64", "tensor(int64)", np.dtype(np.int64), 8),
    DataType("FP16", "TYPE_FP16", "tensor(float16)", np.dtype(np.float16), 2),
    DataType("FP32", "TYPE_FP32", "tensor(float)", np.dtype(np.float32), 4),
    DataType("FP64", "TYPE_FP64", "tensor(double)", np.dtype(np.float64), 8),
    DataType("BYTES", "TYPE_STRING", "tensor(string)", np.dtype(np.object_), 0),
    DataType("BF16", "TYPE_BF16", "tensor(bfloat16)", _BF16, 2),
]

BY_NAME: dict[str, DataType] = {t.name: t for t in _TYPES}
BY_CONFIG: dict[str, DataType] = {t.config: t for t in _TYPES}
BY_ONNX: dict[str, DataType] = {t.onnx: t for t in _TYPES}


def datatype_problem(value: object) -> str:
    """Why a request's ``datatype`` is not a type, saying what would be: missing, the
    config's spelling (``TYPE_INT32``), or a misspelling, then the valid names."""
    valid = f"(valid: {', '.join(BY_NAME)})"
    if value is None or value == "":
        return f"missing 'datatype' {valid}"
    if isinstance(value, str) and value in BY_CONFIG:
        return (f"unknown datatype '{value}': that is the config's spelling; a request says "
                f"'{BY_CONFIG[value].name}' {valid}")
    from inferd.suggest import did_you_mean  # here: difflib for a bad request only, never at start

    hint = did_you_mean(value.upper(), BY_NAME) if isinstance(value, str) else ""
    return f"unknown datatype {value!r}{hint} {valid}"
_BY_NUMPY: dict[np.dtype, DataType] = {t.numpy: t for t in _TYPES if t.numpy is not None}


def from_numpy(dtype: np.dtype) -> DataType:
    """The protocol type of a numpy dtype (str/bytes arrays count as BYTES)."""
    if dtype.kind in ("S", "U", "O"):
        return BY_NAME["BYTES"]
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"numpy dtype {dtype} has no KServe v2 data type") from None


# numpy sizes an array in signed 64-bit bytes: the item size times every non-zero dimension (an
# empty array is still sized by its other dimensions). With 8 bytes the largest item here, the
# product of the non-zero dimensions may not pass this.
MAX_ELEMENTS = (2**63 - 1) // 8
INT64_MAX = 2**63 - 1


def element_count(shape: tuple[int, ...] | list[int], where: str, itemsize: int = 0) -> int:
    """How many elements ``shape`` holds; InvalidArgument, before anything is allocated, when numpy could
    not size such an array (non-zero dimensions that multiply past 2**60, which numpy refuses with an
    internal error). ``itemsize``: the type's bytes per element, when it is fixed. Where Triton refuses
    too (#8182: an element count, or a byte size for ``itemsize``, past the largest int64) its words
    come first."""
    sized = 1
    empty = False
    for d in shape:
        if d == 0:
            empty = True
            continue
        sized *= d
        if sized > MAX_ELEMENTS:
            raise InvalidArgument(_too_many(shape, where, itemsize))
    return 0 if empty else sized


def _too_many(shape: tuple[int, ...] | list[int], where: str, itemsize: int) -> str:
    """Why a shape of more than MAX_ELEMENTS (non-zero) elements is refused: Triton's message where
    its count or byte size passes int64, inferd's otherwise."""
    count = 1
    for d in shape:  # stops once past int64: a long shape of huge dimensions costs nothing more
        if d:
            count *= d
            if count > INT64_MAX:
                return (f"invalid shape for {where}: shape {_short(list(shape))} causes total element count to "
                        f"exceed maximum size of {INT64_MAX}")
    if itemsize > 1 and count > INT64_MAX // itemsize:
        return (f"byte size overflow for {where}: element count ({count}) * data type size ({itemsize}) exceeds "
                f"maximum allowed size ({INT64_MAX})")
    return (f"{where}: shape {_short(list(shape))} holds more elements than any tensor can "
            f"(its non-zero dimensions may multiply to {MAX_ELEMENTS} at most)")


def _short(values: list[int]) -> str:
    text = str(values)
    return text if len(text) <= 120 else text[:117] + "...]"


def decode_bytes(raw: bytes | memoryview, count: int, where: str) -> np.ndarray:
    """Length-prefixed BYTES elements into an object array of ``bytes``."""
    view = memoryview(raw)
    pos, end = 0, len(view)
    # The elements are read before the array is made: a shape that claims more elements than the
    # bytes can frame (each takes 4 bytes at least) fails within len(raw) / 4 steps, never allocating
    # for the claimed count.
    items: list[bytes] = []
    for i in range(count):
        if pos + 4 > end:
            raise InvalidArgument(f"{where}: BYTES data ends after {i} of {count} elements (malformed framing)")
        (length,) = struct.unpack_from("<I", view, pos)
        pos += 4
        if pos + length > end:
            raise InvalidArgument(
                f"{where}: BYTES element {i} claims {length} bytes but only {end - pos} remain (malformed framing)"
            )
        items.append(bytes(view[pos:pos + length]))
        pos += length
    if pos != end:
        raise InvalidArgument(f"{where}: {end - pos} bytes left over after {count} BYTES elements (malformed framing)")
    out = np.empty(count, dtype=np.object_)
    out[:] = items
    return out


def encode_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor's elements, each length-prefixed. An element that is neither bytes nor text (an
    int in an object array, as Triton's QA models return) is its ``str()``, as Triton's python backend
    and client serialize it (``bytes(5)`` would be five zero bytes)."""
    parts = []
    for item in array.reshape(-1):
        if isinstance(item, bytes):
            data = item
        elif isinstance(item, str):
            data = item.encode()
        elif isinstance(item, (bytearray, memoryview)):
            data = bytes(item)
        else:
            data = str(item.item() if isinstance(item, np.generic) else item).encode()
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)
