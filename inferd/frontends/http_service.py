"""The HTTP/REST frontend: KServe v2 routes (and Triton's extensions) over the data plane.

A Starlette app, served by uvicorn on the server's event loop
(:mod:`inferd.frontends.asgi`). Each route decodes (:mod:`inferd.frontends.http_codec`),
calls the same :class:`DataPlane` as gRPC and encodes; errors are
``{"error": "..."}`` with the status of :func:`inferd.frontends.status.http_status`.
Health and readiness answer 200 for true and 400 for false, as Triton does.
Triton's extensions use the data plane's own state, so both frontends see one
set of shared memory regions, trace settings and log settings; a W3C
``traceparent`` header parents a traced request's span as gRPC metadata does.

Limits (:mod:`inferd.frontends.http_limits`): a body larger than ``--http-max-input-size``
(64 MiB by default, Triton's) is refused with 413 before it is all read, one that decompresses
past it and a chunked one of more than 65,536 chunks with 400; restricted groups (``--http-restricted-api``,
:mod:`inferd.frontends.restrictions`) answer 403 without the header.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import logging
import time
import zlib
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from inferd.errors import InferdError, InvalidArgument, ModelExecutionError
from inferd.facade import DECOUPLED_HTTP, DataPlaneAPI, OpenAIBatchAPI
from inferd.frontends import http_codec
from inferd.frontends.grpc_codec import parse_version
from inferd.frontends.http_limits import BodyLimit, decompress, is_openai
from inferd.frontends.openai import OpenAIOptions, lazy_routes
from inferd.frontends.parameters import HeaderForward
from inferd.frontends.restrictions import Restrictions
from inferd.frontends.status import error_headers, http_status
from inferd.types import FrontendStamps

if TYPE_CHECKING:
    from inferd.frontends.openai import OpenAIFrontend

log = logging.getLogger(__name__)

JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024  # Triton's --http-max-input-size default


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(http_codec.dumps(doc), status_code=status, media_type=JSON)


def error_response(exc: BaseException) -> Response:
    status, message = http_status(exc)
    if not isinstance(exc, InferdError):
        log.exception("unexpected error", exc_info=exc)
    response = json_response({"error": message}, status)
    response.headers.update(dict(error_headers(exc)))
    return response


def _trace_values(key: str, value: Any) -> list[str]:
    """A trace setting's JSON value as the TraceSetting RPC takes it (an empty list clears)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, int) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise InvalidArgument(f"trace setting '{key}' must be a string, an array of strings or null, got {value!r}")


def _guarded(handler: Handler, group: str, restrictions: Restrictions) -> Handler:
    rule = group if group in restrictions.by_group else None

    async def run(request: Request) -> Response:
        try:
            if rule is not None:
                client = request.client
                refused = restrictions.refusal(rule, request.headers.get, f"{request.method} {request.url.path}",
                                               f"{client.host}:{client.port}" if client else "")
                if refused is not None:
                    return error_response(refused)
            return await handler(request)
        except Exception as exc:
            return error_response(exc)

    run.__name__ = handler.__name__
    return run


class InferRoute:
    """ASGI: ``POST /v2/models/{m}[/versions/{v}]/infer`` answered here, everything else handed on to
    ``app`` (Starlette). The infer route is the hot path, and Starlette's routing, Request, Response
    and exception middleware cost it ~40 us of CPU and 55 Python calls per request here, 40% of the
    route's in-process cost (``python -m bench.http_counts``); the answer is the same
    :meth:`HttpFrontend.answer_infer` the Starlette route gives. Not used under
    --http-restricted-api's inference group: that check stays in the routes' guard."""

    def __init__(self, frontend: "HttpFrontend", app: Any) -> None:
        self.frontend = frontend
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            parts = scope["path"].split("/")  # ['', 'v2', 'models', m, 'infer'] or with 'versions', v
            n = len(parts)
            if ((n == 5 or (n == 7 and parts[4] == "versions" and parts[5])) and parts[n - 1] == "infer"
                    and parts[3] and parts[2] == "models" and parts[1] == "v2" and not parts[0]):
                await self._infer(parts[3], parts[5] if n == 7 else "", scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _infer(self, name: str, version: str, scope: dict, receive: Any, send: Any) -> None:
        received_ns = time.monotonic_ns()  # the request's wait counts from here (its body's read included)
        # ASGI header names are lower-case; the first of a repeated header wins, as Starlette's get.
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1"), value.decode("latin-1"))
        try:
            chunks = []
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # http.disconnect: the client is gone, no one to answer
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            content, extra, media = await self.frontend.answer_infer(name, version, body, headers, received_ns)
        except Exception as exc:  # what the routes' guard does: a status and a JSON error
            await error_response(exc)(scope, receive, send)
            return
        out = [(b"content-length", str(len(content)).encode()), (b"content-type", media.encode())]
        for key, value in extra.items():
            out.append((key.lower().encode(), value.encode("latin-1")))
        await send({"type": "http.response.start", "status": 200, "headers": out})
        await send({"type": "http.response.body", "body": content})


def _compress(body: bytes, accept: str | None) -> tuple[bytes, str | None]:
    if not accept:
        return body, None
    offered = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    for name in offered:
        if name == "gzip":
            return gzip.compress(body, compresslevel=1), "gzip"
        if name == "deflate":
            return zlib.compress(body, 1), "deflate"
    return body, None



def _sizes(doc: dict, what: str, fields: dict[str, int | None]) -> dict[str, int]:
    """``fields`` of a registration body (each with its default), each a non-negative integer."""
    sizes = {}
    for field, default in fields.items():
        value = doc.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"{what}: '{field}' must be a non-negative integer, got {value!r}")
        sizes[field] = value
    return sizes

async def _json_body(request: Request, what: str, limit: int = DEFAULT_MAX_INPUT_BYTES) -> dict[str, Any]:
    body = await request.body()
    encoding = request.headers.get("content-encoding")
    if encoding:
        body = decompress(body, encoding, limit)
    if not body.strip():
        return {}
    doc = http_codec.load_json(body, what)
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{what}: the JSON body must be an object")
    return doc


async def _control_parameters(request: Request, what: str, limit: int) -> dict[str, Any]:
    """Explicit model control's body: its ``parameters`` (``config``, ``unload_dependents``) as they
    are, and the ``file:<path>`` ones base64-decoded (JSON carries a file's bytes as base64)."""
    doc = await _json_body(request, f"model {what} request", limit)
    params = doc.get("parameters") or {}
    rpc = "RepositoryModelLoad" if what == "load" else "RepositoryModelUnload"
    if not isinstance(params, dict):
        raise InvalidArgument(f"{rpc}: 'parameters' must be a JSON object")
    return {key: _file_content(rpc, key, value) if key.startswith("file:") else value
            for key, value in params.items()}


def _file_content(rpc: str, key: str, value: Any) -> bytes:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise InvalidArgument(f"{rpc}: parameter '{key}' must be the file's content, base64-encoded, as a JSON string; "
                          f"got {str(value)[:40]!r}")


class HttpFrontend:
    """The routes; they call only the :class:`DataPlaneAPI` façade."""

    def __init__(self, dataplane: DataPlaneAPI, restrictions: Restrictions | None = None,
                 max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES, openai: OpenAIOptions | None = None,
                 openai_batches: OpenAIBatchAPI | None = None, forward: HeaderForward | None = None) -> None:
        """``openai_batches``: the core's Batch API (/v1/files, /v1/batches; None: off); ``forward``
        (--http-header-forward-pattern): the headers an infer request's parameters take."""
        self.dp = dataplane
        self.restrictions = restrictions or Restrictions()
        self.max_input = max_input_bytes
        self.openai = openai
        self.openai_batches = openai_batches  # the core's Batch API (/v1/files, /v1/batches); None: off
        self.forward = forward

    def app(self) -> Any:
        r: list[Route] = []

        def route(path: str, handler: Handler, group: str, method: str = "GET", versioned: bool = False) -> None:
            guarded = _guarded(handler, group, self.restrictions)
            r.append(Route(path, guarded, methods=[method]))
            if versioned:
                at = path.index("{model}") + len("{model}")
                r.append(Route(path[:at] + "/versions/{version}" + path[at:], guarded, methods=[method]))

        # The groups are Triton's (--http-restricted-api).
        route("/v2/models/{model}/infer", self.infer, "inference", "POST", versioned=True)  # first: the hot path
        route("/v2/models/{model}/generate", self.generate, "inference", "POST", versioned=True)
        route("/v2/models/{model}/generate_stream", self.generate_stream, "inference", "POST", versioned=True)
        route("/v2/health/live", self.live, "health")
        route("/v2/health/ready", self.ready, "health")
        route("/v2", self.server_metadata, "metadata")
        route("/v2/models/stats", self.statistics, "statistics")
        route("/v2/models/{model}", self.model_metadata, "metadata", versioned=True)
        route("/v2/models/{model}/ready", self.model_ready, "health", versioned=True)
        route("/v2/models/{model}/config", self.model_config, "model-config", versioned=True)
        route("/v2/models/{model}/stats", self.statistics, "statistics", versioned=True)
        route("/v2/repository/index", self.repository_index, "model-repository", "POST")
        route("/v2/repository/models/{model}/load", self.load, "model-repository", "POST")
        route("/v2/repository/models/{model}/unload", self.unload, "model-repository", "POST")
        shm = "shared-memory"
        route("/v2/systemsharedmemory/status", self.shm_status, shm)
        route("/v2/systemsharedmemory/region/{region}/status", self.shm_status, shm)
        route("/v2/systemsharedmemory/region/{region}/register", self.shm_register, shm, "POST")
        route("/v2/systemsharedmemory/region/{region}/unregister", self.shm_unregister, shm, "POST")
        route("/v2/systemsharedmemory/unregister", self.shm_unregister, shm, "POST")
        route("/v2/cudasharedmemory/status", self.cuda_status, shm)
        route("/v2/cudasharedmemory/region/{region}/status", self.cuda_status, shm)
        route("/v2/cudasharedmemory/region/{region}/register", self.cuda_register, shm, "POST")
        route("/v2/cudasharedmemory/region/{region}/unregister", self.cuda_unregister, shm, "POST")
        route("/v2/cudasharedmemory/unregister", self.cuda_unregister, shm, "POST")
        # Batch jobs (inferd's own) run inference: the inference group guards them.
        route("/v2/batches", self.batch_submit, "inference", "POST")
        route("/v2/batches", self.batch_list, "inference")
        route("/v2/batches/{job}", self.batch_status, "inference")
        route("/v2/batches/{job}/results", self.batch_results, "inference")
        route("/v2/batches/{job}/cancel", self.batch_cancel, "inference", "POST")
        for method in ("GET", "POST"):
            route("/v2/trace/setting", self.trace_setting, "trace", method)
            route("/v2/models/{model}/trace/setting", self.trace_setting, "trace", method)
            route("/v2/logging", self.log_settings, "logging", method)

        # The OpenAI-compatible routes (/v1, inferd/frontends/openai/), over the same façade. Their
        # frontend, and the modules behind it, load on the first /v1 request: a server (a frontend
        # worker) that gets none starts and runs without them.
        created = int(time.time())  # the /v1 model objects' "created": when this app was built
        r.extend(lazy_routes(lambda: self._openai(created)))

        async def not_found(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 404
            path = request.url.path
            if is_openai(path):  # OpenAI's words and body, which its clients read
                what = "Invalid URL" if status == 404 else "Method Not Allowed"
                return json_response({"error": {"message": f"{what} ({request.method} {path})",
                                                "type": "invalid_request_error", "param": None, "code": None}}, status)
            what = "method not allowed" if status == 405 else "no such endpoint"
            return json_response({"error": f"{what}: {request.method} {path}"}, status)

        app: Any = Starlette(routes=r, exception_handlers={404: not_found, 405: not_found})
        if "inference" not in self.restrictions.by_group:
            app = InferRoute(self, app)
        return BodyLimit(app, self.max_input)

    def _openai(self, created: int) -> OpenAIFrontend:
        """The /v1 routes' frontend, made on their first request (:func:`lazy_routes`)."""
        from inferd.frontends.openai import OpenAIFrontend

        return OpenAIFrontend(self.dp, self.restrictions, self.openai, self.openai_batches, created=created)

    # -- health and metadata ---------------------------------------------------

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if await self.dp.server_live() else 400)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if await self.dp.server_ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        name, version, extensions = await self.dp.server_metadata()
        return json_response({"name": name, "version": version, "extensions": extensions})

    @staticmethod
    def _target(request: Request) -> tuple[str, int]:
        name = request.path_params["model"]
        return name, parse_version(name, request.path_params.get("version", ""))

    async def model_ready(self, request: Request) -> Response:
        name, version = self._target(request)
        return Response(status_code=200 if await self.dp.model_ready(name, version) else 400)

    async def model_metadata(self, request: Request) -> Response:
        md = await self.dp.model_metadata(*self._target(request))
        tensors = lambda ts: [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in ts]  # noqa: E731
        return json_response({
            "name": md.name, "versions": md.versions, "platform": md.platform,
            "inputs": tensors(md.inputs), "outputs": tensors(md.outputs),
        })

    async def model_config(self, request: Request) -> Response:
        # Imported here: rendering a message as JSON (protobuf's json_format) is this route's alone, so
        # a frontend worker starts without it.
        from inferd._proto.json import message_to_dict

        return json_response(message_to_dict(await self.dp.model_config(*self._target(request))))

    async def statistics(self, request: Request) -> Response:
        name = request.path_params.get("model", "")
        version = parse_version(name, request.path_params.get("version", ""))
        return json_response(http_codec.statistics_json(await self.dp.model_statistics(name, version)))

    # -- model repository --------------------------------------------------------

    async def repository_index(self, request: Request) -> Response:
        doc = await _json_body(request, "repository index request", self.max_input)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgument(f"repository index request: 'ready' must be a boolean, got {ready!r}")
        out = []
        for e in await self.dp.repository_index(ready_only=ready):
            item = {"name": e.name}
            if e.version:
                item["version"] = e.version
            item["state"] = e.state
            if e.reason:
                item["reason"] = e.reason
            out.append(item)
        return json_response(out)

    async def load(self, request: Request) -> Response:
        await self.dp.load_model(request.path_params["model"], await _control_parameters(request, "load", self.max_input))
        return Response(status_code=200)

    async def unload(self, request: Request) -> Response:
        await self.dp.unload_model(request.path_params["model"], await _control_parameters(request, "unload", self.max_input))
        return Response(status_code=200)

    # -- shared memory (Triton's extension; the data plane's regions, shared with gRPC) ------------

    async def shm_status(self, request: Request) -> Response:
        regions = await self.dp.shm_status(request.path_params.get("region", ""))
        return json_response([{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                              for r in regions])

    async def shm_register(self, request: Request) -> Response:
        name = request.path_params["region"]
        doc = await _json_body(request, f"system shared memory register request for region '{name}'", self.max_input)
        key = doc.get("key")
        if not isinstance(key, str):
            raise InvalidArgument(f"system shared memory region '{name}': 'key' must be a string, got {key!r}")
        sizes = _sizes(doc, f"system shared memory region '{name}'", {"offset": 0, "byte_size": None})
        await self.dp.shm_register(name, key, sizes["offset"], sizes["byte_size"])
        return Response(status_code=200)

    async def shm_unregister(self, request: Request) -> Response:
        await self.dp.shm_unregister(request.path_params.get("region", ""))
        return Response(status_code=200)

    async def cuda_status(self, request: Request) -> Response:
        regions = await self.dp.cuda_shm_status(request.path_params.get("region", ""))
        return json_response([{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions])

    async def cuda_register(self, request: Request) -> Response:
        name = request.path_params["region"]
        doc = await _json_body(request, f"CUDA shared memory register request for region '{name}'", self.max_input)
        raw = doc.get("raw_handle")
        b64 = raw.get("b64") if isinstance(raw, dict) else None
        if not isinstance(b64, str):
            raise InvalidArgument(f"CUDA shared memory region '{name}': 'raw_handle' must be {{\"b64\": \"...\"}}, "
                                  f"got {raw!r}")
        try:
            handle = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"CUDA shared memory region '{name}': 'raw_handle' must be a valid base64 encoded "
                                  "cudaIpcMemHandle_t") from None
        sizes = _sizes(doc, f"CUDA shared memory region '{name}'", {"device_id": None, "byte_size": None})
        await self.dp.cuda_shm_register(name, handle, sizes["device_id"], sizes["byte_size"])
        return Response(status_code=200)

    async def cuda_unregister(self, request: Request) -> Response:
        await self.dp.cuda_shm_unregister(request.path_params.get("region", ""))
        return Response(status_code=200)

    # -- tracing and logging -------------------------------------------------------------------

    async def trace_setting(self, request: Request) -> Response:
        """GET reads, POST changes (as the TraceSetting RPC): a setting's value is a
        string, an array of strings, or null (clears it)."""
        model = request.path_params.get("model", "")
        changes = None
        if request.method == "POST":
            doc = await _json_body(request, "trace setting request", self.max_input)
            changes = {key: _trace_values(key, value) for key, value in doc.items()}
        settings = await self.dp.trace_settings(model, changes or None)
        # Triton's JSON: trace_level is an array, the others single strings (left out when unset).
        out: dict[str, Any] = {}
        for key, values in settings.items():
            if key == "trace_level":
                out[key] = values
            elif values:
                out[key] = values[0]
        return json_response(out)

    async def log_settings(self, request: Request) -> Response:
        """GET reads, POST changes (as the LogSettings RPC)."""
        changes = None
        if request.method == "POST":
            changes = await _json_body(request, "log setting request", self.max_input)
        return json_response(await self.dp.log_settings(changes or None))

    # -- batch jobs ----------------------------------------------------------------

    async def batch_submit(self, request: Request) -> Response:
        """``POST /v2/batches?model=NAME[&model_version=N]``, the body a JSONL file of requests."""
        model = request.query_params.get("model", "")
        if not model:
            raise InvalidArgument("batch submission: name the model with the query parameter 'model' "
                                  "(POST /v2/batches?model=NAME)")
        version = parse_version(model, request.query_params.get("model_version", ""))
        body = await request.body()
        encoding = request.headers.get("content-encoding")
        if encoding:
            body = decompress(body, encoding, self.max_input)
        return json_response(await self.dp.batch_submit(body, model, version))

    async def batch_list(self, request: Request) -> Response:
        return json_response({"batches": await self.dp.batch_list()})

    async def batch_status(self, request: Request) -> Response:
        return json_response(await self.dp.batch_status(request.path_params["job"]))

    async def batch_cancel(self, request: Request) -> Response:
        return json_response(await self.dp.batch_cancel(request.path_params["job"]))

    async def batch_results(self, request: Request) -> Response:
        """``?format=jsonl`` (the default: one result per line) or ``npz`` (the output tensors)."""
        fmt = request.query_params.get("format", "jsonl")
        data = await self.dp.batch_results(request.path_params["job"], fmt)
        return Response(data, media_type="application/x-npz" if fmt == "npz" else "application/jsonl")

    # -- inference -----------------------------------------------------------------

    # -- the generate extension (inferd/frontends/http_generate.py) ----------------------------
    # Its modules (http_generate, and orca for the load report) are imported by the routes that use
    # them, on a server's first generate request: most servers never get one, and a frontend worker
    # starts without them.

    async def _generate_responses(self, request: Request):  # type: ignore[no-untyped-def]
        """The request's responses (StreamResponse items), plain model or decoupled. A request
        that is refused before it reaches the model raises here (a JSON error answer)."""
        from inferd.frontends import http_generate

        name, version = request.path_params["model"], request.path_params.get("version", "")
        metadata = await self.dp.model_metadata(name, parse_version(name, version))
        doc = await _json_body(request, f"generate request for model '{name}'", self.max_input)
        return self.dp.infer_stream(http_generate.decode_generate_request(doc, metadata, version))

    async def generate(self, request: Request) -> Response:
        """One JSON object; a model that answers with other than exactly one response is an error."""
        from inferd.frontends import http_generate

        responses = []
        async with aclosing(await self._generate_responses(request)) as items:
            async for item in items:
                if item.error is not None:
                    raise item.error
                if item.response is not None:
                    responses.append(item.response)
        if len(responses) != 1:
            raise ModelExecutionError(f"{http_generate.ONE_RESPONSE} (model '{request.path_params['model']}' sent "
                                      f"{len(responses)})")
        answer = json_response(http_generate.generate_response(responses[0]))
        answer.headers.update(await self._load_report(request))
        return answer

    async def _load_report(self, request: Request) -> dict[str, str]:
        """The ORCA ``endpoint-load-metrics`` header the request asks for (orca.py), or none."""
        from inferd.frontends import orca

        fmt = request.headers.get(orca.REQUEST_HEADER)
        if fmt is None:
            return {}
        value = orca.header_value(fmt, await self.dp.kv_cache_blocks())
        return {orca.RESPONSE_HEADER: value} if value is not None else {}

    async def generate_stream(self, request: Request) -> Response:
        """Server-sent events, one per response; the status is the first response's, as Triton sets it."""
        from inferd.frontends import http_generate

        items = (await self._generate_responses(request)).__aiter__()
        first = None
        async for first in items:
            if first.response is not None or first.error is not None:
                break
        status = http_status(first.error)[0] if first is not None and first.error is not None else 200

        def event(item) -> bytes | None:  # type: ignore[no-untyped-def]
            if item.error is not None:
                return http_generate.sse({"error": http_status(item.error)[1]})
            if item.response is None:  # a final flag alone
                return None
            try:
                return http_generate.sse(http_generate.generate_response(item.response))
            except InferdError as exc:
                return http_generate.sse(http_generate.error_json(exc))

        async def body():  # type: ignore[no-untyped-def]
            try:
                if first is not None and (chunk := event(first)) is not None:
                    yield chunk
                async for item in items:
                    if (chunk := event(item)) is not None:
                        yield chunk
                    # One loop turn per event: once the client has gone, uvicorn's send returns at once
                    # and a model that keeps the stream full lets this loop run without ever suspending,
                    # so the disconnect that would cancel it (Starlette's listener) could never be seen.
                    await asyncio.sleep(0)
            finally:
                close = getattr(items, "aclose", None)
                if close is not None:
                    await close()  # the client went away: stop the model's stream too

        return StreamingResponse(body(), status_code=status, media_type="text/event-stream; charset=utf-8",
                                 headers=await self._load_report(request))

    async def infer(self, request: Request) -> Response:
        """The infer route through Starlette: taken only under --http-restricted-api's inference
        group (else :class:`InferRoute` answers it first, on the same :meth:`answer_infer`)."""
        received_ns = time.monotonic_ns()  # the request's wait counts from here (its body's read included)
        body = await request.body()
        content, headers, media = await self.answer_infer(
            request.path_params["model"], request.path_params.get("version", ""), body, request.headers, received_ns)
        return Response(content, headers=headers, media_type=media)

    async def answer_infer(self, name: str, version: str, body: bytes, headers: Any,
                           received_ns: int) -> tuple[bytes, dict[str, str], str]:
        """One infer request's answer: its body, its extra headers and its media type.
        ``headers``: the request's, a case-insensitive mapping of str (lower-case names do)."""
        encoding = headers.get("content-encoding")
        if encoding:
            body = decompress(body, encoding, self.max_input)
        decoded = http_codec.decode_infer_request(name, version, body, headers.get(http_codec.HEADER_LENGTH))
        decoded.request.received_ns = received_ns
        if self.forward is not None:
            decoded.request.parameters.update(self.forward.forwarded(headers.items()))
        # Triton's HTTP_* trace timestamps: RECV from the call's start to its body decoded, SEND from
        # the answer back to its body encoded (what the route hands to the ASGI server); an error is
        # stamped as it leaves here for the error handler.
        stamps = decoded.request.frontend = FrontendStamps("http", received_ns, time.monotonic_ns())
        try:
            # A W3C traceparent (and tracestate) header makes the request span a child of the caller's.
            response = await self.dp.infer(decoded.request, decoupled_error=DECOUPLED_HTTP,
                                           trace_carrier=lambda: headers)
            send_ns = time.monotonic_ns()
            content, header_length = http_codec.encode_infer_response(response, decoded)
            out_headers = {}
            if header_length is not None:
                out_headers["Inference-Header-Content-Length"] = str(header_length)
            content, compressed = _compress(content, headers.get("accept-encoding"))
            if compressed:
                out_headers["Content-Encoding"] = compressed
            stamps.sent(send_ns, time.monotonic_ns())
            return content, out_headers, JSON if header_length is None else "application/octet-stream"
        except Exception:
            now = time.monotonic_ns()
            stamps.sent(now, now)
            raise
        finally:
            stamps.sent(None, None)  # cancelled: the trace ends without a send (a no-op once sent)
