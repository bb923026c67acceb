"""The core answers what frontend workers forward, with the single-process frontends' own code.

A forwarded gRPC method arrives as the client's encoded request; the core decodes it,
runs the same :class:`InferenceServicer` method the one-process server runs and sends
back the encoded response (or the status it aborted with). A forwarded HTTP request
is run through the same Starlette app as an in-process ASGI call. So every
non-inference RPC and route behaves exactly as in one process, against the one copy
of the models, statistics, shared-memory regions and settings.
"""

from __future__ import annotations

from typing import Any

from inferd._proto import grpc_service_pb2 as pb


class _Abort(Exception):
    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """The slice of grpc.aio.ServicerContext the control-plane methods use."""

    def __init__(self, metadata: tuple = ()) -> None:
        self._metadata = metadata

    async def abort(self, code: Any, details: str = "") -> None:
        raise _Abort(code, details)

    def time_remaining(self) -> None:
        return None

    def invocation_metadata(self) -> tuple:
        return self._metadata


class Passthrough:
    def __init__(self, dataplane: Any) -> None:
        from inferd.server.grpc_service import InferenceServicer
        from inferd.server.http_service import HttpFrontend

        self.servicer = InferenceServicer(dataplane)
        self.http_app = HttpFrontend(dataplane).app()
        service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        self._requests = {m.name: getattr(pb, m.input_type.name) for m in service.methods
                          if not m.client_streaming}

    async def grpc(self, method: str, payload: bytes) -> tuple:
        """(True, encoded response) or (False, status code name, details)."""
        cls = self._requests.get(method)
        if cls is None or method == "ModelInfer":
            return False, "UNIMPLEMENTED", f"method {method} is not forwarded to the core"
        try:
            request = cls.FromString(payload)
        except Exception as exc:  # a client sent bytes that do not decode
            return False, "INVALID_ARGUMENT", f"{method}: the request does not decode: {exc}"
        try:
            response = await getattr(self.servicer, method)(request, _Context())
        except _Abort as abort:
            return False, abort.code.name, abort.details
        return True, response.SerializeToString()

    async def http(self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body) of the route, run in-process."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
                 "root_path": "", "headers": headers, "client": None, "server": None}
        sent = False
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def receive() -> dict:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.http_app(scope, receive, send)
        return start.get("status", 500), list(start.get("headers", [])), b"".join(chunks)
