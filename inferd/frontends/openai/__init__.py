"""The OpenAI-compatible frontend: ``/v1`` on the HTTP port, beside ``/v2``.

A third frontend over the same façade (:class:`inferd.dataplane.DataPlaneAPI`), so it answers the same
in one process and through every frontend worker. It owns only what is OpenAI's: tokenisation and chat
templates (:mod:`._text`), request fields (:mod:`._fields`), SSE framing and the error body
(:mod:`._errors`); a chat or completion choice is a sequence of the model's own scheduler
(:mod:`._generate`), an embedding one inference. Which models it serves, and how, their configs say
(:mod:`inferd.config._openai`). OpenAI's Batch API is the core's (:mod:`inferd.batchjobs`), which
runs each line through this translation (:class:`BatchLines`).
"""

from inferd.frontends.openai._errors import error_body
from inferd.frontends.openai._routes import PRIORITY_HEADER, BatchLines, OpenAIFrontend, OpenAIOptions

__all__ = ["PRIORITY_HEADER", "BatchLines", "OpenAIFrontend", "OpenAIOptions", "error_body"]
