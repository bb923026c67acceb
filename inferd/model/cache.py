"""Triton's response cache: a model's outputs kept for requests that repeat.

One :class:`ResponseCache` per server (``--cache-config local,size=BYTES``),
shared by every model whose config says ``response_cache { enable: true }``,
as Triton's ``local`` cache is. An entry is found by :func:`request_key`: the
model's name and version, every input (name, datatype, shape and bytes) and
what else changes the result (the request's own parameters, the outputs it
asks for). Entries are evicted least recently used first when the bytes they
hold would pass the size; one larger than the whole cache is not kept.

It holds the model's outputs before they are shaped for a request, so a hit is
shaped (requested outputs, classification, shared memory) like a fresh result.
Entries are copies, read-only: what a hit hands out is never written to, and a
pooled output buffer is never pinned by the cache. Used on the event loop only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from inferd.errors import InvalidArgument
from inferd.types import InferenceRequest

# Request parameters that say how to schedule or transport a request, not what it
# computes: they stay out of the key (protocol and Triton extension names).
NOT_IN_KEY = frozenset({
    "priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output",
    "binary_data_size", "binary_data", "triton_enable_empty_final_response", "headers",
})

CACHE_NAME = "local"


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int
    bytes: int
    size: int
    evictions: int


class ResponseCache:
    """An LRU map from request keys to model outputs, bounded by their bytes."""

    def __init__(self, size_bytes: int) -> None:
        if size_bytes < 1:
            raise ValueError(f"the response cache size must be >= 1 byte, got {size_bytes}")
        self.size = size_bytes
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._bytes = 0
        self._evictions = 0

    def lookup(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The outputs kept for ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def insert(self, key: bytes, outputs: dict[str, np.ndarray]) -> bool:
        """Keep a read-only copy of ``outputs`` under ``key``, evicting the least
        recently used entries as needed; False when it is larger than the cache."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        nbytes = sum(_nbytes(a) for a in outputs.values())
        if nbytes > self.size:
            return False
        while self._bytes + nbytes > self.size:
            _, (_, freed) = self._entries.popitem(last=False)
            self._bytes -= freed
            self._evictions += 1
        kept = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            kept[name] = copy
        self._entries[key] = (kept, nbytes)
        self._bytes += nbytes
        return True

    def stats(self) -> CacheStats:
        return CacheStats(len(self._entries), self._bytes, self.size, self._evictions)


def _nbytes(array: np.ndarray) -> int:
    if array.dtype.kind == "O":  # BYTES: each element's bytes and a 4-byte length, as on the wire
        return sum(len(x) if isinstance(x, (bytes, str)) else 0 for x in array.reshape(-1)) + 4 * array.size
    return int(array.nbytes)


def request_key(model: str, version: int, request: InferenceRequest) -> bytes:
    """What identifies a request's result: 16 bytes of BLAKE2b over the model, the
    version, each input (by name: datatype, shape, data), the request's parameters
    that are not about scheduling or transport, and the outputs asked for by name."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{model}\0{version}\0".encode())
    for name in sorted(request.inputs):
        array = request.inputs[name]
        h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype.kind == "O":
            for item in array.reshape(-1):
                data = item if isinstance(item, bytes) else str(item).encode()
                h.update(len(data).to_bytes(4, "little"))
                h.update(data)
        else:
            h.update(np.ascontiguousarray(array).data)
    params = request.parameters
    if params:
        for key in sorted(params):
            if key not in NOT_IN_KEY:
                h.update(f"p\0{key}\0{params[key]!r}\0".encode())
    if request.requested_outputs:
        h.update(("o\0" + "\0".join(sorted(r.name for r in request.requested_outputs))).encode())
    return h.digest()


def parse_cache_config(settings: list[str]) -> int | None:
    """The ``local`` cache's size in bytes from ``--cache-config`` values
    (``local,size=BYTES``, as Triton's); None when none is given."""
    size: int | None = None
    for arg in settings:
        name, comma, setting = arg.partition(",")
        if not comma or not name:
            raise InvalidArgument(f"No cache specified. --cache-config option format is "
                                  f"<cache name>,<setting>=<value>. Got {arg}")
        key, equals, value = setting.partition("=")
        if not equals or not key or not value:
            raise InvalidArgument(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {arg}")
        if name != CACHE_NAME:
            raise InvalidArgument(f"--cache-config {arg}: inferd has only the '{CACHE_NAME}' cache "
                                  f"(an in-process LRU by bytes), not '{name}'")
        if key != "size":
            raise InvalidArgument(f"--cache-config {arg}: the '{CACHE_NAME}' cache has only the setting 'size', "
                                  f"not '{key}'")
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1:
            raise InvalidArgument(f"--cache-config {arg}: size must be a number of bytes >= 1, got '{value}'")
    return size
