"""Checks on a ``/v1`` request body's fields: unknown fields are ignored (as OpenAI does), a known one
of the wrong type or range is refused naming it, the value and what would be valid.

Written here rather than with a schema library: the server's only extra dependencies for ``/v1``
are the tokenizer and the template engine, and each check is one line that names the field as
OpenAI's own errors do (``param``)."""

from __future__ import annotations

import json
from typing import Any

from inferd.facade import OPENAI_BATCH_ENDPOINTS
from inferd.frontends.openai._errors import RequestError

MAX_N = 16  # choices per request: each is a sequence of its own
MAX_STOP = 4  # OpenAI's limit
MAX_CHOICES = 128  # prompts x n in one request: each choice is a sequence, started at once
MAX_INPUTS = 2048  # an embedding request's inputs (OpenAI's limit)
WINDOW = "24h"  # the one completion_window OpenAI offers a batch


def _show(value: Any) -> str:
    return json.dumps(value)[:80]


class Body:
    def __init__(self, doc: Any, what: str) -> None:
        if not isinstance(doc, dict):
            raise RequestError(f"{what}: the JSON body must be an object, got {_show(doc)}")
        self.doc = doc
        self.what = what

    def _bad(self, name: str, want: str) -> RequestError:
        return RequestError(f"{self.what}: '{name}' must be {want}, got {_show(self.doc.get(name))}", name)

    def string(self, name: str, required: bool = False) -> str | None:
        value = self.doc.get(name)
        if value is None:
            if required:
                raise RequestError(f"{self.what}: '{name}' is required", name)
            return None
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.doc.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(name, "true or false")
        return value

    def integer(self, name: str, low: int, high: int | None = None) -> int | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise self._bad(name, f"an integer {low}..{high}" if high is not None else f"an integer >= {low}")
        return value

    def number(self, name: str, low: float, high: float) -> float | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise self._bad(name, f"a number {low}..{high}")
        return float(value)

    def stop(self) -> list[str]:
        value = self.doc.get("stop")
        if value is None:
            return []
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
                or not 1 <= len(stops) <= MAX_STOP:
            raise self._bad("stop", f"a non-empty string or a list of 1..{MAX_STOP} of them")
        return stops

    def include_usage(self, stream: bool) -> bool:
        value = self.doc.get("stream_options")
        if value is None:
            return False
        if not isinstance(value, dict):
            raise self._bad("stream_options", "an object")
        if not stream:
            raise RequestError(f"{self.what}: 'stream_options' is allowed only with 'stream': true", "stream_options")
        usage = value.get("include_usage", False)
        if not isinstance(usage, bool):
            raise RequestError(f"{self.what}: 'stream_options.include_usage' must be true or false, got "
                               f"{_show(usage)}", "stream_options")
        return usage


def token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool)
                                                            and v >= 0 for v in value)


def texts_or_ids(value: Any, name: str, what: str) -> list[str | list[int]]:
    """A ``prompt`` or ``input``: a string, a list of strings, a list of token ids or a list of such lists."""
    if isinstance(value, str):
        return [value]
    if token_ids(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) or token_ids(v) for v in value):
        return list(value)
    if value is None:
        raise RequestError(f"{what}: '{name}' is required", name)
    raise RequestError(f"{what}: '{name}' must be a string, a list of strings, a list of token ids (integers "
                       f">= 0) or a list of such lists, none empty; got {_show(value)}", name)


ROLES = ("system", "developer", "user", "assistant", "tool")


def messages(value: Any, what: str) -> list[dict[str, Any]]:
    """Chat messages as a template sees them: each with its role and its content as one string (text parts
    joined); other fields (``name``, ``tool_calls``, ...) passed on as given."""
    if not isinstance(value, list) or not value:
        raise RequestError(f"{what}: 'messages' must be a non-empty list of message objects, got {_show(value)}",
                           "messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{what}: '{where}' must be an object, got {_show(message)}", "messages")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{what}: '{where}.role' must be one of {', '.join(ROLES)}, got {_show(role)}",
                               "messages")
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"{what}: '{where}.content[{j}]' must be a text part "
                                       f"({{\"type\": \"text\", \"text\": ...}}; the model takes text only), got "
                                       f"{_show(part)}", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None:
            content = ""
            if role != "assistant":
                raise RequestError(f"{what}: '{where}.content' is required for role '{role}'", "messages")
        elif not isinstance(content, str):
            raise RequestError(f"{what}: '{where}.content' must be a string or a list of text parts, got "
                               f"{_show(content)}", "messages")
        out.append({**message, "content": content})
    return out



def batch_fields(doc: Any) -> tuple[str, str, dict[str, str] | None]:
    """A batch request's (input_file_id, endpoint, metadata), each checked; RequestError naming the field."""
    if not isinstance(doc, dict):
        raise RequestError("batch request: the JSON body must be an object")
    file_id = doc.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise RequestError(f"batch request: 'input_file_id' must be the id of an uploaded file, got "
                           f"{file_id!r}", "input_file_id")
    endpoint = doc.get("endpoint")
    if endpoint not in OPENAI_BATCH_ENDPOINTS:
        raise RequestError(f"batch request: 'endpoint' must be one of {', '.join(OPENAI_BATCH_ENDPOINTS)}, got "
                           f"{endpoint!r}", "endpoint")
    if doc.get("completion_window") != WINDOW:
        raise RequestError(f"batch request: 'completion_window' must be '{WINDOW}', got "
                           f"{doc.get('completion_window')!r}", "completion_window")
    metadata = doc.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise RequestError("batch request: 'metadata' must be an object of at most 16 string keys and string "
                           "values", "metadata")
    return file_id, endpoint, metadata
