"""The OpenAI-compatible frontend: ``/v1`` on the HTTP port, beside ``/v2``.

A third frontend over the same façade (:class:`inferd.dataplane.DataPlaneAPI`), so it answers the same
in one process and through every frontend worker. It owns only what is OpenAI's: tokenisation and chat
templates (:mod:`._text`), request fields (:mod:`._fields`), SSE framing and the error body
(:mod:`._errors`); a chat or completion choice is a sequence of the model's own scheduler
(:mod:`._generate`), an embedding one inference. Which models it serves, and how, their configs say
(:mod:`inferd.config._openai`). OpenAI's Batch API is the core's (:mod:`inferd.batchjobs`), which
runs each line through this translation (:class:`BatchLines`).

This module is what the HTTP app needs to offer ``/v1``: the options, the route table and
:func:`lazy_routes`, which builds the frontend (importing the modules above) when the first ``/v1``
request arrives, so a server, or a frontend worker, that serves none never loads them. The routes'
own names (:class:`OpenAIFrontend`, :class:`BatchLines`, :func:`error_body`, ``PRIORITY_HEADER``)
are imported from their modules when first asked for here.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from inferd.frontends.openai._errors import error_body
    from inferd.frontends.openai._routes import PRIORITY_HEADER, BatchLines, OpenAIFrontend

__all__ = ["PRIORITY_HEADER", "ROUTES", "BatchLines", "OpenAIFrontend", "OpenAIOptions", "error_body", "lazy_routes"]

# (path, the OpenAIFrontend method answering it, its --http-restricted-api group as the /v2 routes', method)
ROUTES: tuple[tuple[str, str, str, str], ...] = (
    ("/v1/models", "models", "metadata", "GET"),
    ("/v1/models/{model:path}", "model", "metadata", "GET"),
    ("/v1/completions", "completions", "inference", "POST"),
    ("/v1/chat/completions", "chat", "inference", "POST"),
    ("/v1/embeddings", "embeddings", "inference", "POST"),
    ("/v1/files", "file_create", "inference", "POST"),
    ("/v1/files", "file_list", "inference", "GET"),
    ("/v1/files/{file_id}", "file_get", "inference", "GET"),
    ("/v1/files/{file_id}", "file_delete", "inference", "DELETE"),
    ("/v1/files/{file_id}/content", "file_content", "inference", "GET"),
    ("/v1/batches", "batch_create", "inference", "POST"),
    ("/v1/batches", "batch_list", "inference", "GET"),
    ("/v1/batches/{batch_id}", "batch_get", "inference", "GET"),
    ("/v1/batches/{batch_id}/cancel", "batch_cancel", "inference", "POST"),
)

# The names defined by the routes' modules, and which module holds each.
_LAZY = {"PRIORITY_HEADER": "_routes", "BatchLines": "_routes", "OpenAIFrontend": "_routes", "error_body": "_errors"}


@dataclass(frozen=True)
class OpenAIOptions:
    """``--openai-api-key`` (repeatable) and ``--openai-api-key-file``: with any key, every ``/v1``
    request must carry ``Authorization: Bearer <one of them>``."""

    api_keys: tuple[str, ...] = ()
    # The Batch API's directory, where an upload is written for the core to take (the server sets it:
    # <batch dir>/openai); "": the Batch API is off.
    batch_dir: str = ""

    def to_plain(self) -> dict[str, Any]:
        return {"api_keys": list(self.api_keys), "batch_dir": self.batch_dir}

    @classmethod
    def from_plain(cls, plain: dict[str, Any] | None) -> "OpenAIOptions":
        plain = plain or {}
        return cls(tuple(plain.get("api_keys", ())), plain.get("batch_dir", ""))


def lazy_routes(build: Callable[[], OpenAIFrontend]) -> list[Route]:
    """The ``/v1`` routes of :data:`ROUTES`, for the HTTP app. The first request to any of them calls
    ``build`` (which imports and makes the frontend; on the event loop, synchronously, so it runs once)
    and every request is answered by that frontend's handler, as if its routes had been added."""
    frontend = functools.cache(build)

    def route(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            return await frontend().handlers[name](request)

        run.__name__ = name  # Starlette names the route after its endpoint
        return run

    return [Route(path, route(name), methods=[method]) for path, name, _, method in ROUTES]


def __getattr__(name: str) -> Any:
    """:data:`_LAZY`'s names, imported from their module on first use (the core's batch lines, or
    the HTTP app's first ``/v1`` request)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
