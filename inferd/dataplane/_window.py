"""The checks every shared memory region (system or CUDA) makes of a tensor's window."""

from __future__ import annotations

from inferd.dtypes import DataType, element_count
from inferd.errors import InvalidArgument, NotFound


def check_span(label: str, name: str, byte_size: int, closed: bool, offset: int, size: int, where: str) -> None:
    """``[offset, offset + size)`` lies inside a registered region of ``byte_size`` bytes;
    ``label``: how the region is named in messages ("shared memory", "CUDA shared memory")."""
    if closed:
        raise NotFound(f"{where}: {label} region '{name}' was unregistered")
    if offset < 0 or size < 0 or offset + size > byte_size:
        raise InvalidArgument(
            f"{where}: invalid offset + byte size for shared memory region '{name}': "
            f"offset {offset} + byte size {size} is outside the region's {byte_size} bytes"
        )


def check_tensor_bytes(name: str, dtype: DataType, shape: tuple[int, ...], size: int, where: str) -> int:
    """The element count of a fixed-size tensor whose window is ``size`` bytes; refuses a type the
    server cannot hold and a window of the wrong size."""
    if dtype.numpy is None:
        raise InvalidArgument(f"{where}: data type {dtype.name} is not supported on this server")
    count = element_count(shape, where, dtype.itemsize)
    expected = count * dtype.itemsize
    if size != expected:
        raise InvalidArgument(
            f"{where}: shared memory region '{name}': byte size {size} does not match the tensor's "
            f"{expected} bytes (shape {list(shape)} of {dtype.name})"
        )
    return count
