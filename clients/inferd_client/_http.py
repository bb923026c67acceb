"""The HTTP/REST clients: :class:`HttpClient` (blocking, ``http.client``) and
:class:`AsyncHttpClient` (asyncio, aiohttp: ``pip install 'inferd-client[aio-http]'``), both
running the calls of :mod:`inferd_client._http_codec`."""

from __future__ import annotations

import http.client
import ssl as _ssl
import threading
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from inferd_client import _http_codec as codec
from inferd_client._http_codec import HttpCall, Reply, error_of
from inferd_client._messages import (
    CudaRegionStatus, InferError, InferResult, Inputs, ModelMetadata, ModelStatistics, Outputs, ParameterValue,
    RegionStatus, RepositoryModel, ServerMetadata,
)

T = TypeVar("T")
AIOHTTP_REQUIREMENT = "aiohttp>=3.9"


def ssl_context(ssl: bool, root_certificates: str | None, private_key: str | None,
                certificate_chain: str | None, verify: bool = True) -> _ssl.SSLContext | None:
    """None for plain HTTP; else a context trusting ``root_certificates`` (default the
    system's), presenting the client's certificate for mutual TLS."""
    if not (ssl or root_certificates or private_key or certificate_chain):
        return None
    if (private_key is None) != (certificate_chain is None):
        raise ValueError("mutual TLS needs both private_key and certificate_chain")
    context = _ssl.create_default_context(cafile=root_certificates)
    if not verify:
        context.check_hostname = False
        context.verify_mode = _ssl.CERT_NONE
    if certificate_chain and private_key:
        context.load_cert_chain(certificate_chain, private_key)
    return context


def _split(url: str, context: _ssl.SSLContext | None) -> tuple[str, str, int | None, str]:
    if "://" not in url:
        url = ("https://" if context is not None else "http://") + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"bad URL '{url}': expected HOST:PORT or http(s)://HOST:PORT")
    return parts.scheme, parts.hostname, parts.port, parts.path.rstrip("/")


class HttpClient:
    """A blocking KServe v2 / Triton HTTP client: the calls of :class:`inferd_client.Client`
    (no streams: HTTP has none). One keep-alive connection per thread; failures raise
    :class:`InferError` (``code`` the gRPC status of the same meaning, ``http_status``).

    TLS: ``ssl=True``, an ``https://`` URL or any PEM file: ``root_certificates`` (the CA to
    trust), ``private_key`` and ``certificate_chain`` (the client's, for mutual TLS);
    ``verify=False`` skips checking the server. ``headers`` go on every request.
    """

    def __init__(self, url: str = "127.0.0.1:8000", *, ssl: bool = False, root_certificates: str | None = None,
                 private_key: str | None = None, certificate_chain: str | None = None, verify: bool = True,
                 headers: Mapping[str, str] | None = None, timeout_s: float | None = 60.0) -> None:
        self.url = url
        self._context = ssl_context(ssl or url.startswith("https://"), root_certificates, private_key,
                                    certificate_chain, verify)
        self._scheme, self._host, self._port, self._prefix = _split(url, self._context)
        self._headers = dict(headers or {})
        self._timeout = timeout_s
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._scheme == "https":
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                                   context=self._context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _send(self, call: HttpCall[Any]) -> Reply:
        headers = {**self._headers, **call.headers}
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(call.method, self._prefix + call.path, body=call.body, headers=headers)
                response = conn.getresponse()
                body = response.read()
                return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()  # the server closed an idle keep-alive connection: one new try
                self._local.conn = None
                if attempt:
                    raise InferError(f"the server at {self.url} closed the connection", http_status=None) from None
            except OSError as exc:
                conn.close()
                self._local.conn = None
                raise InferError(f"cannot reach {self.url}: {exc}") from None
        raise AssertionError("unreachable")

    def _run(self, call: HttpCall[T]) -> T:
        reply = self._send(call)
        if reply.status not in call.ok:
            raise error_of(reply)
        return call.decode(reply)

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- health and metadata ----------------------------------------------------------

    def is_live(self) -> bool:
        return self._run(codec.server_live())

    def is_ready(self) -> bool:
        return self._run(codec.server_ready())

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return self._run(codec.model_ready(name, version))

    def server_metadata(self) -> ServerMetadata:
        return self._run(codec.get_server_metadata())

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return self._run(codec.get_model_metadata(name, version))

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The model's configuration as the JSON Triton serves (the gRPC clients give the protobuf)."""
        return self._run(codec.model_config(name, version))

    def model_statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        return self._run(codec.model_statistics(name, version))

    # -- inference --------------------------------------------------------------------

    def infer(self, model: str, inputs: Inputs, *, outputs: Outputs | None = None, version: str = "",
              request_id: str = "", priority: int = 0, timeout_us: int = 0, sequence_id: int | str = 0,
              sequence_start: bool = False, sequence_end: bool = False,
              parameters: Mapping[str, ParameterValue] | None = None) -> InferResult:
        """As :meth:`inferd_client.Client.infer`, over HTTP with binary tensor data."""
        return self._run(codec.infer(
            model, inputs, outputs=outputs, version=version, request_id=request_id, priority=priority,
            timeout_us=timeout_us, sequence_id=sequence_id, sequence_start=sequence_start,
            sequence_end=sequence_end, parameters=parameters))

    # -- model repository -------------------------------------------------------------

    def repository_index(self, ready: bool = False) -> tuple[RepositoryModel, ...]:
        return self._run(codec.repository_index(ready))

    def load_model(self, name: str, config: str | Mapping[str, Any] | None = None,
                   files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) ``name``; ``config`` (JSON text or a dict) overrides its config.pbtxt,
        ``files`` (``"1/model.onnx"`` -> bytes) replace its version folders' files."""
        self._run(codec.load_model(name, config, files))

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._run(codec.unload_model(name, unload_dependents))

    # -- trace and log settings -------------------------------------------------------

    def get_trace_settings(self, model: str = "") -> dict[str, Any]:
        return self._run(codec.trace_settings(model, None))

    def update_trace_settings(self, settings: Mapping[str, Any], model: str = "") -> dict[str, Any]:
        """Set trace settings globally or for ``model``; a None value clears that setting."""
        return self._run(codec.trace_settings(model, settings))

    def get_log_settings(self) -> dict[str, Any]:
        return self._run(codec.log_settings(None))

    def update_log_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return self._run(codec.log_settings(settings))

    # -- shared memory ----------------------------------------------------------------

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self._run(codec.register_system_shm(name, key, byte_size, offset))

    def unregister_system_shared_memory(self, name: str = "") -> None:
        self._run(codec.unregister_system_shm(name))

    def system_shared_memory_status(self, name: str = "") -> dict[str, RegionStatus]:
        return self._run(codec.system_shm_status(name))

    def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._run(codec.register_cuda_shm(name, raw_handle, device_id, byte_size))

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        self._run(codec.unregister_cuda_shm(name))

    def cuda_shared_memory_status(self, name: str = "") -> dict[str, CudaRegionStatus]:
        return self._run(codec.cuda_shm_status(name))


class AsyncHttpClient:
    """:class:`HttpClient` for asyncio, over aiohttp (an optional dependency); create it
    inside the event loop that uses it.

    TLS: ``ssl=True``, an ``https://`` URL or any PEM file: ``root_certificates`` (the CA to
    trust), ``private_key`` and ``certificate_chain`` (the client's, for mutual TLS);
    ``verify=False`` skips checking the server. ``headers`` go on every request.
    """

    def __init__(self, url: str = "127.0.0.1:8000", *, ssl: bool = False, root_certificates: str | None = None,
                 private_key: str | None = None, certificate_chain: str | None = None, verify: bool = True,
                 headers: Mapping[str, str] | None = None, timeout_s: float | None = 60.0) -> None:
        try:
            import aiohttp
        except ImportError:
            raise ImportError(f"AsyncHttpClient needs aiohttp: pip install '{AIOHTTP_REQUIREMENT}'") from None
        self.url = url
        context = ssl_context(ssl or url.startswith("https://"), root_certificates, private_key,
                              certificate_chain, verify)
        scheme, host, port, prefix = _split(url, context)
        self._base = f"{scheme}://{host}" + (f":{port}" if port else "") + prefix
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context if context is not None else True),
            headers=dict(headers or {}), timeout=aiohttp.ClientTimeout(total=timeout_s))
        self._errors: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)

    async def _run(self, call: HttpCall[T]) -> T:
        try:
            async with self._session.request(call.method, self._base + call.path, data=call.body,
                                             headers=call.headers) as response:
                body = await response.read()
                reply = Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, body)
        except self._errors as exc:
            raise InferError(f"cannot reach {self.url}: {exc}") from None
        if reply.status not in call.ok:
            raise error_of(reply)
        return call.decode(reply)

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> "AsyncHttpClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- health and metadata ----------------------------------------------------------

    async def is_live(self) -> bool:
        return await self._run(codec.server_live())

    async def is_ready(self) -> bool:
        return await self._run(codec.server_ready())

    async def is_model_ready(self, name: str, version: str = "") -> bool:
        return await self._run(codec.model_ready(name, version))

    async def server_metadata(self) -> ServerMetadata:
        return await self._run(codec.get_server_metadata())

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return await self._run(codec.get_model_metadata(name, version))

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The model's configuration as the JSON Triton serves (the gRPC clients give the protobuf)."""
        return await self._run(codec.model_config(name, version))

    async def model_statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        return await self._run(codec.model_statistics(name, version))

    # -- inference --------------------------------------------------------------------

    async def infer(self, model: str, inputs: Inputs, *, outputs: Outputs | None = None, version: str = "",
              request_id: str = "", priority: int = 0, timeout_us: int = 0, sequence_id: int | str = 0,
              sequence_start: bool = False, sequence_end: bool = False,
              parameters: Mapping[str, ParameterValue] | None = None) -> InferResult:
        """As :meth:`inferd_client.Client.infer`, over HTTP with binary tensor data."""
        return await self._run(codec.infer(
            model, inputs, outputs=outputs, version=version, request_id=request_id, priority=priority,
            timeout_us=timeout_us, sequence_id=sequence_id, sequence_start=sequence_start,
            sequence_end=sequence_end, parameters=parameters))

    # -- model repository -------------------------------------------------------------

    async def repository_index(self, ready: bool = False) -> tuple[RepositoryModel, ...]:
        return await self._run(codec.repository_index(ready))

    async def load_model(self, name: str, config: str | Mapping[str, Any] | None = None,
                   files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) ``name``; ``config`` (JSON text or a dict) overrides its config.pbtxt,
        ``files`` (``"1/model.onnx"`` -> bytes) replace its version folders' files."""
        await self._run(codec.load_model(name, config, files))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._run(codec.unload_model(name, unload_dependents))

    # -- trace and log settings -------------------------------------------------------

    async def get_trace_settings(self, model: str = "") -> dict[str, Any]:
        return await self._run(codec.trace_settings(model, None))

    async def update_trace_settings(self, settings: Mapping[str, Any], model: str = "") -> dict[str, Any]:
        """Set trace settings globally or for ``model``; a None value clears that setting."""
        return await self._run(codec.trace_settings(model, settings))

    async def get_log_settings(self) -> dict[str, Any]:
        return await self._run(codec.log_settings(None))

    async def update_log_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return await self._run(codec.log_settings(settings))

    # -- shared memory ----------------------------------------------------------------

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        await self._run(codec.register_system_shm(name, key, byte_size, offset))

    async def unregister_system_shared_memory(self, name: str = "") -> None:
        await self._run(codec.unregister_system_shm(name))

    async def system_shared_memory_status(self, name: str = "") -> dict[str, RegionStatus]:
        return await self._run(codec.system_shm_status(name))

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        await self._run(codec.register_cuda_shm(name, raw_handle, device_id, byte_size))

    async def unregister_cuda_shared_memory(self, name: str = "") -> None:
        await self._run(codec.unregister_cuda_shm(name))

    async def cuda_shared_memory_status(self, name: str = "") -> dict[str, CudaRegionStatus]:
        return await self._run(codec.cuda_shm_status(name))
