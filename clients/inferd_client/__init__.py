"""A typed client for KServe v2 / Triton servers (inferd, Triton), over gRPC and HTTP.

    from inferd_client import Client
    with Client("127.0.0.1:8001") as client:
        result = client.infer("simple", {"INPUT0": a, "INPUT1": b})
        print(result["OUTPUT0"])

:class:`Client` blocks, :class:`AsyncClient` is the same for asyncio (both gRPC, on one
codec); :class:`HttpClient` / :class:`AsyncHttpClient` are the same calls over HTTP/REST. Inputs are numpy
arrays by name (object arrays of ``bytes``/``str`` travel as BYTES), outputs come back
as numpy arrays in an :class:`InferResult`. Streams (sequences, decoupled models) are
``client.stream()``; system shared memory is :mod:`inferd_client.shared_memory` with
:class:`ShmInput` / :class:`Output`. Errors raise :class:`InferError`.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from inferd_client._aio import AsyncClient, AsyncStream
from inferd_client._http import AsyncHttpClient, HttpClient
from inferd_client._messages import (
    BatchStatistics, CudaRegionStatus, InferError, InferResult, ModelMetadata, ModelStatistics, Output, RegionStatus,
    RepositoryModel, ServerMetadata, ShmInput, StatDuration, TensorMetadata,
)
from inferd_client._sync import Client, Stream
from inferd_client._tensors import datatype_of, numpy_dtype
from inferd_client.shared_memory import SystemSharedMemoryRegion

try:
    __version__ = _version("inferd-client")
except PackageNotFoundError:  # imported from a source tree
    __version__ = "0+unknown"

__all__ = [
    "AsyncClient",
    "AsyncHttpClient",
    "AsyncStream",
    "BatchStatistics",
    "Client",
    "CudaRegionStatus",
    "HttpClient",
    "ModelStatistics",
    "RepositoryModel",
    "StatDuration",
    "InferError",
    "InferResult",
    "ModelMetadata",
    "Output",
    "RegionStatus",
    "ServerMetadata",
    "ShmInput",
    "Stream",
    "SystemSharedMemoryRegion",
    "TensorMetadata",
    "datatype_of",
    "numpy_dtype",
]
