"""What an HTTP request body may be: its size, its chunks, what it decompresses to.

- ``--http-max-input-size`` (64 MiB by default, Triton's): a body larger than that is refused with 413
  as soon as that is known (:class:`BodyLimit`: from Content-Length before any of it is read, else when
  the bytes read pass it); ``/v1`` requests get OpenAI's error body, the others KServe's.
- A gzip/deflate body that decompresses past the same limit is refused with 400 in Triton's words
  (:func:`decompress`, Triton's #8570; it stops inflating there).
- A chunked body of more than 65,536 non-empty chunks is refused with 400 in Triton's words and the
  connection closed (:class:`ChunkLimitedProtocol`, Triton's #8770): each chunk costs the server a
  buffer however small it is. Chunks are invisible to an ASGI app, so this is counted in uvicorn's
  protocol, from the HTTP parser's chunk callbacks.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from inferd.errors import InferdError, InvalidArgument, TooLarge, Unimplemented

MAX_CHUNKS = 1 << 16  # Triton's kMaxChunkedChunks
TOO_MANY_CHUNKS = (f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. Send fewer or larger "
                   "HTTP chunks.")


def too_large(size: int | str, limit: int, what: str = "the request body") -> TooLarge:
    return TooLarge(f"{what} has {size} bytes, more than the {limit} this server accepts "
                    "(--http-max-input-size)")


def decompressed_too_large(limit: int) -> InvalidArgument:
    """Triton's 400 for a body that inflates past --http-max-input-size."""
    return InvalidArgument(f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use "
                           "--http-max-input-size to increase the limit.")


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded; InvalidArgument (Triton's words) when it would decompress past ``limit`` bytes
    (it stops there: at most ``limit`` + 1 bytes are ever inflated)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Unimplemented(f"Content-Encoding '{encoding}' is not supported; use gzip or deflate")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    out = b""
    rest = body
    while True:  # a gzip body may hold several members, one after the other
        inflater = zlib.decompressobj(wbits)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
            if len(out) > limit or inflater.unconsumed_tail:
                raise decompressed_too_large(limit)
            out += inflater.flush()
        except zlib.error as exc:
            raise InvalidArgument(f"the request body is not valid {encoding} data: {exc}") from None
        if not inflater.eof:
            raise InvalidArgument(f"the request body is not valid {encoding} data: it ends before the stream does")
        rest = inflater.unused_data
        if not rest or encoding != "gzip":
            return out


def is_openai(path: str) -> bool:
    """A ``/v1`` path: answered in OpenAI's error body."""
    return path == "/v1" or path.startswith("/v1/")


async def send_error(scope: dict, send: Any, exc: InferdError, status: int) -> None:
    """``exc`` as the error body of the path's API (OpenAI's under /v1, KServe's elsewhere)."""
    if is_openai(scope.get("path", "")):
        from inferd.frontends.openai._errors import error_body  # here: a server may never serve /v1

        doc = error_body(exc)[1]
    else:
        doc = {"error": exc.message}
    body = json.dumps(doc, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is refused (413) as soon as that is known:
    from its Content-Length before any of it is read, else when the bytes read pass it."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit
        for key, value in scope["headers"]:
            if key == b"content-length":
                if not value.isdigit() or int(value) > limit:
                    await send_error(scope, send, too_large(value.decode("latin-1")[:32], limit), 413)
                    return
                break
        seen = 0

        async def bounded() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(f"more than {limit}", limit)
            return message

        await self.app(scope, bounded, send)


def chunk_limited_protocol() -> Any:
    """uvicorn's httptools protocol counting a chunked body's non-empty chunks (None without httptools:
    uvicorn's h11 protocol, whose bodies are not counted)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class ChunkLimitedProtocol(HttpToolsProtocol):  # type: ignore[misc, valid-type]
        """Past :data:`MAX_CHUNKS` non-empty chunks in one request: 400 with Triton's message, the
        connection closed and nothing more read (the app sees its client gone). Only the parser's
        chunk callback is added: a request that is not chunked costs nothing more."""

        _counted: Any = None  # the request (uvicorn's cycle) whose chunks are counted
        _chunks = 0
        _refused = False

        def on_chunk_header(self) -> None:
            # Every chunk but the last, empty one (which ends the body) holds data: more than MAX_CHUNKS
            # + 1 chunk headers is more than MAX_CHUNKS non-empty chunks (seen one chunk after Triton sees it).
            cycle = getattr(self, "cycle", None)
            if cycle is not self._counted:
                self._counted, self._chunks = cycle, 0
            self._chunks += 1
            if self._chunks > MAX_CHUNKS + 1:
                self._refuse()
                raise _TooManyChunks  # stops the parser; uvicorn's own 400 is not sent (send_400_response)

        def _refuse(self) -> None:
            self._refused = True
            body = json.dumps({"error": TOO_MANY_CHUNKS}, separators=(",", ":")).encode()
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + body)
            cycle = getattr(self, "cycle", None)
            if cycle is not None:  # the app's receive answers http.disconnect, its sends are dropped
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            if not self._refused:
                super().send_400_response(msg)

    return ChunkLimitedProtocol


class _TooManyChunks(Exception):
    pass
