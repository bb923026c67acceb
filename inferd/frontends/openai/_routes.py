"""The ``/v1`` routes: models, completions, chat completions, embeddings; files and batches.

Each route reads its body (:mod:`._fields`), finds the model through the façade
(``DataPlaneAPI.openai_models``: the same call in one process and in every frontend worker),
renders and counts text with the model's tokenizer and template (:mod:`._text`), and runs each
choice as a sequence of the model's scheduler (:mod:`._generate`) or each embedding input as one
inference (``DataPlaneAPI.infer``). Streams are server-sent events ending in ``data: [DONE]``.

OpenAI's Batch API (``/v1/files``, ``/v1/batches``) is the core's (:mod:`inferd.batchjobs`): these
routes check the request's fields, write an upload where the core takes it, and call
:class:`~inferd.facade.OpenAIBatchAPI`. The core runs each batch line through this same translation
(:class:`BatchLines`: an :class:`OpenAIFrontend` over the core's own data plane, every request it
makes a background one).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse

from inferd.errors import InvalidArgument, NotFound, TooLarge, Unimplemented
from inferd.facade import OPENAI_MAX_FILE_BYTES, OPENAI_UPLOADS, DataPlaneAPI, OpenAIBatchAPI
from inferd.frontends.openai import ROUTES, OpenAIOptions
from inferd.frontends.openai._errors import AuthenticationFailed, RequestError, error_body
from inferd.frontends.openai._fields import (
    MAX_CHOICES, MAX_INPUTS, MAX_N, Body, batch_fields, messages, texts_or_ids,
)
from inferd.frontends.openai._generate import Piece, Sampling, run_choice
from inferd.frontends.openai._text import INSTALL, ModelText
from inferd.frontends.restrictions import Restrictions
from inferd.frontends.status import error_headers
from inferd.types import InferenceRequest

PRIORITY_HEADER = "inferd-priority"  # a request's priority level (the model's default without it)
JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc, separators=(",", ":")), status_code=status, media_type=JSON)


def _answer(answered: dict[str, Any] | Response) -> Response:
    return answered if isinstance(answered, Response) else _json(answered)


def _error(exc: BaseException) -> Response:
    status, body = error_body(exc)
    response = _json(body, status)
    response.headers.update(dict(error_headers(exc)))  # a draining server's, for a balancer in front
    return response


def _sse(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _shown(prompt: str | bytes) -> str:
    """A prompt as ``echo`` shows it: a prompt of token ids as its bytes decode (a cut character replaced)."""
    return prompt if isinstance(prompt, str) else prompt.decode("utf-8", errors="replace")


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _merge(streams: list[AsyncIterator[Piece]]) -> AsyncIterator[Piece]:
    """The pieces of several choices as they come. The queue is bounded, so a slow reader holds the
    choices' streams back (and through them the model's) instead of piling up text."""
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=2 * len(streams))
    end = object()

    async def pump(stream: AsyncIterator[Piece]) -> None:
        try:
            async with aclosing(stream):  # type: ignore[type-var]
                async for piece in stream:
                    await queue.put(piece)
            await queue.put(end)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is end:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class OpenAIFrontend:
    """The routes; they call only the :class:`DataPlaneAPI` façade and, for files and batches, the
    :class:`OpenAIBatchAPI` (``batches``: None, the Batch API is off). ``background``: every request
    this frontend makes is a batch line's (the core's :class:`BatchLines`). ``created``: the wall-clock
    second OpenAI's model objects say they were created (None: now). ``handlers``: each route of
    :data:`~inferd.frontends.openai.ROUTES` by its method's name, guarded (restricted groups, API key,
    OpenAI's error body)."""

    def __init__(self, dataplane: DataPlaneAPI, restrictions: Restrictions | None = None,
                 options: OpenAIOptions | None = None, batches: OpenAIBatchAPI | None = None,
                 background: bool = False, created: int | None = None) -> None:
        self.dp = dataplane
        self.restrictions = restrictions or Restrictions()
        options = options or OpenAIOptions()
        self.keys = [k.encode() for k in options.api_keys]
        self.batches = batches if options.batch_dir else None
        self.uploads = Path(options.batch_dir) / OPENAI_UPLOADS if options.batch_dir else None
        self.background = background
        self._texts: dict[str, ModelText] = {}  # one per /v1 model of the repository, rebuilt when it changes
        self.created = int(time.time()) if created is None else created  # wall-clock seconds
        # --http-restricted-api groups, as the /v2 routes they stand beside.
        self.handlers: dict[str, Handler] = {name: self._guarded(getattr(self, name), group)
                                             for _, name, group, _ in ROUTES}

    def _guarded(self, handler: Handler, group: str) -> Handler:
        rule = group if group in self.restrictions.by_group else None

        async def run(request: Request) -> Response:
            try:
                if rule is not None:
                    client = request.client
                    refused = self.restrictions.refusal(rule, request.headers.get,
                                                        f"{request.method} {request.url.path}",
                                                        f"{client.host}:{client.port}" if client else "")
                    if refused is not None:
                        return _error(refused)
                if self.keys:
                    self._authenticate(request)
                return await handler(request)
            except Exception as exc:
                return _error(exc)

        run.__name__ = handler.__name__
        return run

    def _authenticate(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("You didn't provide an API key: send it in the header "
                                       "'Authorization: Bearer <key>'")
        given = key.strip().encode()
        if not any(hmac.compare_digest(given, k) for k in self.keys):
            raise AuthenticationFailed("Incorrect API key provided")

    async def _text(self, name: str) -> ModelText:
        found = await self.dp.openai_models(name)  # an unknown model raises its NotFound
        if not found:
            raise NotFound(f"The model '{name}' is not served under /v1: its config has no parameter "
                           "'inferd.openai' (chat, completion or embedding)")
        cached = self._texts.get(name)
        if cached is None or cached.spec.digest != found[0].spec.digest:
            full = await self.dp.openai_models(name, assets=True)
            if not full:
                raise NotFound(f"The model '{name}' is no longer served under /v1")
            cached = self._texts[name] = ModelText.build(name, full[0].spec)
        return cached

    @staticmethod
    async def _body(request: Request, what: str) -> Body:
        raw = await request.body()
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise RequestError(f"{what}: the body is not JSON: {exc}") from None
        return Body(doc, what)

    @staticmethod
    def _priority(request: Request) -> int:
        raw = request.headers.get(PRIORITY_HEADER)
        if raw is None:
            return 0
        if not raw.strip().isdigit():
            raise RequestError(f"header '{PRIORITY_HEADER}' must be a priority level (an integer >= 1), got "
                               f"{raw[:40]!r}")
        return int(raw)

    # -- models ---------------------------------------------------------------------------------

    def _model_object(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "inferd"}

    async def models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [self._model_object(m.name) for m in await self.dp.openai_models()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        await self._text(name)
        return _json(self._model_object(name))

    # -- completions ---------------------------------------------------------------------------

    def _sampling(self, body: Body, text: ModelText, name: str, prompt_tokens: int, param: str,
                  priority: int) -> Sampling:
        max_tokens = body.integer("max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = body.integer("max_tokens", 1)
        limit = text.spec.max_context
        if limit:
            wanted = prompt_tokens + (max_tokens or 1)
            if wanted > limit:
                raise RequestError(
                    f"This model's maximum context length is {limit} tokens. However, you requested {wanted} "
                    f"tokens ({prompt_tokens} in the {param}, {max_tokens or 1} in the completion). Please reduce "
                    f"the length of the {param} or completion.", param, "context_length_exceeded")
            if max_tokens is None:
                max_tokens = limit - prompt_tokens
        if body.boolean("logprobs") or body.doc.get("logprobs") not in (None, False):
            raise RequestError(f"model '{name}' gives no log probabilities: leave 'logprobs' out", "logprobs")
        body.string("user")  # accepted, as OpenAI does (checked for its type only)
        return Sampling(max_tokens=max_tokens, temperature=body.number("temperature", 0.0, 2.0),
                        top_p=body.number("top_p", 0.0, 1.0), seed=body.integer("seed", 0, 2**63 - 1),
                        stop=body.stop(), priority=priority, background=self.background)

    async def completions(self, request: Request) -> Response:
        return _answer(await self._completions(await self._body(request, "completion request"),
                                               self._priority(request)))

    async def _completions(self, body: Body, priority: int) -> dict[str, Any] | Response:
        name = body.string("model", required=True) or ""
        text = await self._text(name)
        if text.spec.kind not in ("chat", "completion"):
            raise RequestError(f"model '{name}' is an {text.spec.kind} model: use /v1/embeddings", "model")
        given = texts_or_ids(body.doc.get("prompt"), "prompt", body.what)
        # A prompt of token ids is sent as the bytes they stand for and counted as given (not re-encoded).
        prompts = [p if isinstance(p, str) else text.prompt_of_ids(p, "prompt") for p in given]
        counts = [text.count(p) if isinstance(p, str) else len(p) for p in given]
        sampling = self._sampling(body, text, name, max(counts), "prompt", priority)
        echo = body.boolean("echo")
        return await self._complete(body, text, name, prompts, counts, sampling, chat=False, echo=echo)

    async def chat(self, request: Request) -> Response:
        return _answer(await self._chat(await self._body(request, "chat completion request"),
                                        self._priority(request)))

    async def _chat(self, body: Body, priority: int) -> dict[str, Any] | Response:
        name = body.string("model", required=True) or ""
        text = await self._text(name)
        if text.spec.kind != "chat":
            raise RequestError(f"model '{name}' is a{'n' if text.spec.kind == 'embedding' else ''} "
                               f"{text.spec.kind} model: use /v1/{'embeddings' if text.spec.kind == 'embedding' else 'completions'}",
                               "model")
        extra = body.doc.get("chat_template_kwargs") or {}
        if not isinstance(extra, dict):
            raise RequestError(f"{body.what}: 'chat_template_kwargs' must be an object", "chat_template_kwargs")
        prompt = text.render(name, messages(body.doc.get("messages"), body.what),
                             body.boolean("add_generation_prompt", True), extra)
        count = text.count(prompt)
        sampling = self._sampling(body, text, name, count, "messages", priority)
        return await self._complete(body, text, name, [prompt], [count], sampling, chat=True)

    async def _complete(self, body: Body, text: ModelText, name: str, prompts: list[str | bytes],
                        counts: list[int], sampling: Sampling, chat: bool,
                        echo: bool = False) -> dict[str, Any] | Response:
        n = body.integer("n", 1, MAX_N) or 1
        if len(prompts) * n > MAX_CHOICES:
            raise RequestError(f"{body.what}: {len(prompts)} prompt(s) x n={n} make {len(prompts) * n} choices; "
                               f"one request may ask for at most {MAX_CHOICES}", "n")
        stream = body.boolean("stream")
        include_usage = body.include_usage(stream)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        # Choice i*n + j: the j-th of prompt i (OpenAI's order for a list of prompts).
        choices = [(i * n + j, prompt) for i, prompt in enumerate(prompts) for j in range(n)]
        streams = [run_choice(self.dp, name, text.spec, prompt, sampling, index, rid, 0 if index % n else counts[index // n])
                   for index, prompt in choices]
        pieces = _merge(streams) if len(streams) > 1 else streams[0]
        prompt_tokens = sum(counts)
        obj = "chat.completion" if chat else "text_completion"
        if not stream:
            texts = {index: (_shown(prompt) if echo else "") for index, prompt in choices}
            reasons: dict[int, str | None] = {}
            tokens = 0
            async with aclosing(pieces):  # type: ignore[type-var]
                async for piece in pieces:
                    texts[piece.index] += piece.text
                    tokens += piece.tokens
                    if piece.finish_reason:
                        reasons[piece.index] = piece.finish_reason
            out = []
            for index, _ in choices:
                if chat:
                    out.append({"index": index, "message": {"role": "assistant", "content": texts[index]},
                                "logprobs": None, "finish_reason": reasons.get(index)})
                else:
                    out.append({"index": index, "text": texts[index], "logprobs": None,
                                "finish_reason": reasons.get(index)})
            return {"id": rid, "object": obj, "created": int(time.time()), "model": name, "choices": out,
                    "usage": _usage(prompt_tokens, tokens)}
        return await self._stream(rid, name, chat, choices, pieces, prompt_tokens, include_usage, echo)

    async def _stream(self, rid: str, name: str, chat: bool, choices: list[tuple[int, str | bytes]],
                      pieces: AsyncIterator[Piece], prompt_tokens: int, include_usage: bool,
                      echo: bool) -> Response:
        items = pieces.__aiter__()
        try:  # the first piece before the status is sent: a refusal is an error answer, not a 200
            first: Piece | None = await items.__anext__()
        except StopAsyncIteration:
            first = None
        except BaseException:
            await items.aclose()  # type: ignore[attr-defined]
            raise
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage_field = {"usage": None} if include_usage else {}

        def chunk(index: int, content: str | None, reason: str | None, role: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if content is not None:
                    delta["content"] = content
                choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": index, "text": content or "", "logprobs": None, "finish_reason": reason}
            return _sse({"id": rid, "object": obj, "created": created, "model": name, "choices": [choice],
                         **usage_field})

        async def body() -> AsyncIterator[bytes]:
            tokens = 0
            try:
                for index, prompt in choices:  # the role (or the echoed prompt) first, as OpenAI sends it
                    if chat:
                        yield chunk(index, "", None, role=True)
                    elif echo:
                        yield chunk(index, _shown(prompt), None)
                piece = first
                while piece is not None:
                    tokens += piece.tokens
                    if piece.text:
                        yield chunk(piece.index, piece.text, None)
                    if piece.finish_reason:
                        yield chunk(piece.index, None if chat else "", piece.finish_reason)
                    # One loop turn per event, so a disconnect (Starlette's listener) is seen even when the
                    # model keeps the stream full (generate_stream does the same).
                    await asyncio.sleep(0)
                    try:
                        piece = await items.__anext__()
                    except StopAsyncIteration:
                        piece = None
                if include_usage:
                    yield _sse({"id": rid, "object": obj, "created": created, "model": name, "choices": [],
                                "usage": _usage(prompt_tokens, tokens)})
                yield DONE
            except Exception as exc:  # the model failed mid-stream: the error as OpenAI streams it
                yield _sse(error_body(exc)[1])
            finally:
                await items.aclose()  # type: ignore[attr-defined]  # the client went away: stop the sequences

        return StreamingResponse(body(), media_type="text/event-stream")

    # -- embeddings ----------------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        return _json(await self._embeddings(await self._body(request, "embedding request"), self._priority(request)))

    async def _embeddings(self, body: Body, priority: int) -> dict[str, Any]:
        name = body.string("model", required=True) or ""
        text = await self._text(name)
        spec = text.spec
        if spec.kind != "embedding":
            raise RequestError(f"model '{name}' is a {spec.kind} model, not an embedding model: use "
                               "/v1/chat/completions or /v1/completions", "model")
        inputs = texts_or_ids(body.doc.get("input"), "input", body.what)
        if len(inputs) > MAX_INPUTS:
            raise RequestError(f"{body.what}: 'input' has {len(inputs)} items; at most {MAX_INPUTS}", "input")
        fmt = body.string("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise RequestError(f"{body.what}: 'encoding_format' must be float or base64, got {fmt!r}",
                               "encoding_format")
        size = body.integer("dimensions", 1)
        if size is not None and size != spec.full_dimension and size not in spec.dimensions:
            allowed = sorted({*spec.dimensions, spec.full_dimension})
            raise RequestError(f"model '{name}' does not give embeddings of {size} dimensions; it gives "
                               f"{', '.join(map(str, allowed))}", "dimensions")
        body.string("user")
        vocab = text.tokenizer.get_vocab_size(with_added_tokens=True)
        ids_list = []
        for i, item in enumerate(inputs):
            ids = text.encode(item) if isinstance(item, str) else item
            if not ids:
                raise RequestError(f"{body.what}: input[{i}] has no tokens", "input")
            if max(ids) >= vocab:
                raise RequestError(f"{body.what}: input[{i}]: token id {max(ids)} is not in the model's "
                                   f"vocabulary (0..{vocab - 1})", "input")
            if spec.max_context and len(ids) > spec.max_context:
                raise RequestError(f"This model's maximum context length is {spec.max_context} tokens, however "
                                   f"input[{i}] has {len(ids)} tokens. Please reduce the length of the input.",
                                   "input", "context_length_exceeded")
            ids_list.append(ids)
        shape = (1, -1) if spec.batched else (-1,)
        received = time.monotonic_ns()
        responses = await asyncio.gather(*(self.dp.infer(InferenceRequest(
            model_name=name, inputs={spec.ids_input: np.asarray(ids, dtype=spec.ids_dtype).reshape(shape)},
            priority=priority, received_ns=received, background=self.background))
            for ids in ids_list))  # concurrent: they share batches
        data = []
        for i, response in enumerate(responses):
            vector = _pool(np.asarray(response.outputs[spec.embedding_output], dtype=np.float32), spec.pooling,
                           spec.batched)
            if size is not None:
                vector = vector[:size]
            if spec.normalize:
                norm = float(np.linalg.norm(vector))
                vector = vector / norm if norm > 0 else vector
            value: Any = (base64.b64encode(vector.astype("<f4").tobytes()).decode() if fmt == "base64"
                          else vector.astype(np.float32).tolist())
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(ids) for ids in ids_list)
        return {"object": "list", "data": data, "model": name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def answer(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        """One batch line's body, answered as its endpoint answers a request (never streamed: a batch
        line's answer is one JSON body, so ``stream`` and ``stream_options`` are left out)."""
        doc = {k: v for k, v in doc.items() if k not in ("stream", "stream_options")}
        handler, what = {"/v1/chat/completions": (self._chat, "chat completion request"),
                         "/v1/completions": (self._completions, "completion request"),
                         "/v1/embeddings": (self._embeddings, "embedding request")}[url]
        answered = await handler(Body(doc, what), 0)
        assert isinstance(answered, dict)  # not streamed
        return answered

    # -- the Batch API: fields checked here, the files and batches the core's (OpenAIBatchAPI) ------------

    def _batch_api(self) -> tuple[OpenAIBatchAPI, Path]:
        if self.batches is None or self.uploads is None:
            raise Unimplemented("the Batch API (/v1/files, /v1/batches) needs the server's batch directory "
                                "(--batch-dir); this frontend was started without one")
        return self.batches, self.uploads

    async def file_create(self, request: Request) -> Response:
        api, uploads = self._batch_api()
        try:
            import python_multipart  # noqa: F401  # what Starlette parses forms with
        except ImportError:
            raise Unimplemented(f"file upload: the server lacks python-multipart: {INSTALL}") from None
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise RequestError("file upload: send the file as multipart/form-data with the fields 'file' and "
                               "'purpose'", "file")
        async with request.form(max_files=1, max_fields=8) as form:
            upload = form.get("file")
            purpose = form.get("purpose")
            if not isinstance(purpose, str):
                raise RequestError("file upload: the field 'purpose' is missing (it must be 'batch')", "purpose")
            if purpose != "batch":
                raise RequestError(f"file upload: 'purpose' must be 'batch' (the only purpose this server keeps "
                                   f"files for), got {purpose!r}", "purpose")
            if upload is None or isinstance(upload, str):
                raise RequestError("file upload: the field 'file' (the file's bytes) is missing", "file")
            filename = upload.filename or "upload.jsonl"
            uploads.mkdir(parents=True, exist_ok=True)
            staged = uploads / f"upload-{uuid.uuid4().hex}"
            try:
                with open(staged, "wb") as f:
                    size = 0
                    while chunk := await upload.read(1 << 20):
                        size += len(chunk)
                        if size > OPENAI_MAX_FILE_BYTES:
                            raise TooLarge(f"file upload: '{filename}' has more than {OPENAI_MAX_FILE_BYTES} "
                                           "bytes, the most a batch input file may have")
                        f.write(chunk)
                return _json(await api.openai_file_create(filename, purpose, staged.name))
            finally:
                staged.unlink(missing_ok=True)  # taken by the core, or refused

    async def file_get(self, request: Request) -> Response:
        return _json(await self._batch_api()[0].openai_file(request.path_params["file_id"]))

    async def file_list(self, request: Request) -> Response:
        return _json(await self._batch_api()[0].openai_files(request.query_params.get("purpose")))

    async def file_delete(self, request: Request) -> Response:
        try:
            return _json(await self._batch_api()[0].openai_file_delete(request.path_params["file_id"]))
        except InvalidArgument as exc:  # its batch still runs
            raise RequestError(exc.message, "file_id") from None

    async def file_content(self, request: Request) -> Response:
        path = await self._batch_api()[0].openai_file_content(request.path_params["file_id"])
        return FileResponse(path, media_type="application/octet-stream")

    async def batch_create(self, request: Request) -> Response:
        api = self._batch_api()[0]
        raw = await request.body()
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise RequestError(f"batch request: the body is not JSON: {exc}") from None
        file_id, endpoint, metadata = batch_fields(doc)
        try:
            return _json(await api.openai_batch_create(file_id, endpoint, metadata))
        except InvalidArgument as exc:  # the file is not a batch input file
            raise RequestError(exc.message, "input_file_id") from None

    async def batch_list(self, request: Request) -> Response:
        query = request.query_params
        raw = query.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            raise RequestError(f"batch list: 'limit' must be an integer from 1 to 100, got {raw[:20]!r}", "limit")
        try:
            return _json(await self._batch_api()[0].openai_batches(query.get("after"), int(raw)))
        except InvalidArgument as exc:  # 'after' names no batch
            raise RequestError(exc.message, "after") from None

    async def batch_get(self, request: Request) -> Response:
        return _json(await self._batch_api()[0].openai_batch(request.path_params["batch_id"]))

    async def batch_cancel(self, request: Request) -> Response:
        try:
            return _json(await self._batch_api()[0].openai_batch_cancel(request.path_params["batch_id"]))
        except InvalidArgument as exc:  # it ended otherwise
            raise RequestError(exc.message, code="batch_not_cancellable") from None


def _pool(output: np.ndarray, pooling: str, batched: bool) -> np.ndarray:
    if batched:
        output = output[0]
    if pooling == "mean":
        return output.mean(axis=0)
    if pooling == "first":
        return output[0]
    if pooling == "last":
        return output[-1]
    return output.reshape(-1)


class BatchLines:
    """How the core runs OpenAI batch lines (:class:`inferd.batchjobs.OpenAILines`): each body through
    this module's translation, as its endpoint answers a request, over the core's own data plane, so
    every request it makes carries ``background`` (the hand-off would not carry it) and waits for
    capacity that interactive requests leave idle; a line's error in OpenAI's shape."""

    def __init__(self, dataplane: DataPlaneAPI) -> None:
        self._v1 = OpenAIFrontend(dataplane, background=True)

    async def answer(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._v1.answer(url, body)

    @staticmethod
    def error(exc: BaseException) -> tuple[int, dict[str, Any]]:
        return error_body(exc)
