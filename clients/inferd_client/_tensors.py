"""Tensors on the wire: numpy dtype <-> KServe v2 datatype name, BYTES framing,
and the output decoding shared by the sync and asyncio clients."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

# The protocol's names for numpy's types (BF16 needs ml_dtypes and is left out).
_DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_BY_DTYPE = {dtype: name for name, dtype in _DATATYPES.items() if name != "BYTES"}

# InferTensorContents' field for each datatype, for servers that answer without raw contents.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def datatype_of(array: np.ndarray) -> str:
    """The protocol's datatype for ``array``: object, ``bytes_`` and ``str_`` arrays are BYTES."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _BY_DTYPE.get(array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype)
    if name is None:
        raise TypeError(f"numpy dtype {array.dtype} has no KServe v2 datatype; use one of {sorted(_BY_DTYPE.values())}")
    return name


def numpy_dtype(datatype: str) -> np.dtype:
    try:
        return _DATATYPES[datatype]
    except KeyError:
        raise TypeError(f"unknown datatype '{datatype}'; valid: {', '.join(_DATATYPES)}") from None


def element_count(shape: Sequence[int]) -> int:
    count = 1
    for d in shape:
        count *= int(d)
    return count


def serialize(array: np.ndarray) -> bytes:
    """The tensor's raw contents: little-endian values, or length-prefixed BYTES elements."""
    if datatype_of(array) != "BYTES":
        return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    parts = []
    for item in array.reshape(-1):
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize(raw: bytes | memoryview, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """``serialize``'s inverse; BYTES come back as an object array of ``bytes``."""
    count = element_count(shape)
    if datatype != "BYTES":
        dtype = numpy_dtype(datatype)
        if len(raw) != count * dtype.itemsize:
            raise ValueError(f"{datatype} tensor of shape {list(shape)} needs {count * dtype.itemsize} bytes, "
                             f"got {len(raw)}")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    out = np.empty(count, dtype=np.object_)
    view = memoryview(raw)
    pos = 0
    for i in range(count):
        if pos + 4 > len(view):
            raise ValueError(f"BYTES tensor ends after {i} of {count} elements")
        (length,) = struct.unpack_from("<I", view, pos)
        out[i] = bytes(view[pos + 4:pos + 4 + length])
        pos += 4 + length
    return out.reshape(shape)


def from_contents(contents: object, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """A tensor sent in InferTensorContents' typed fields rather than raw bytes."""
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise ValueError(f"datatype {datatype} cannot travel in typed contents")
    values = list(getattr(contents, field))
    if datatype == "BYTES":
        out = np.empty(len(values), dtype=np.object_)
        out[:] = values
        return out.reshape(shape)
    return np.array(values, dtype=numpy_dtype(datatype)).reshape(shape)
