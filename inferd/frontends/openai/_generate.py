"""One choice of a completion: a sequence of the model's scheduler, its text as it comes.

The prompt's text goes into the model's text input as one request through
``DataPlaneAPI.infer_stream`` (a decoupled model: one response per step, or per piece of text); each
response's text output is decoded as UTF-8 as it comes (a character split over two responses waits
for its end). Stop strings are found here: text that could begin one is held back until it cannot,
and a choice that meets one ends there and closes its stream, which cancels the sequence in the core
(its row leaves at the next step). A client that goes away closes it the same way.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.facade import OpenAISpec
from inferd.facade import DataPlaneAPI
from inferd.types import InferenceRequest


@dataclass
class Sampling:
    """What a choice asks of the model (its request parameters)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    priority: int = 0
    background: bool = False  # a batch line's: on capacity interactive requests leave idle

    def parameters(self, index: int) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.seed is not None:
            params["seed"] = self.seed + index  # n choices from one seed: each its own, all reproducible
        return params


@dataclass
class Piece:
    """Text for one choice; ``finish_reason`` set on its last (``stop`` or ``length``)."""

    index: int
    text: str
    finish_reason: str | None = None
    tokens: int = 0  # the model's responses this piece stands for (its completion tokens)


def finish_reason(generated: int, sampling: Sampling, spec: OpenAISpec) -> str:
    """``length`` when the completion reached a limit on its tokens (the request's max_tokens, or the model's
    own max_new_tokens: the model cut it), ``stop`` when the model ended it (its end token). OpenAI reports a
    cut answer as ``length`` and vLLM does too (its max_tokens, its max_model_len); Triton's OpenAI frontend
    says ``stop`` for every answer, which a client that continues on ``length`` takes for a complete one."""
    limits = [n for n in (sampling.max_tokens, spec.max_new_tokens) if n]
    return "length" if limits and generated >= min(limits) else "stop"


async def run_choice(dp: DataPlaneAPI, model: str, spec: OpenAISpec, prompt: str | bytes, sampling: Sampling,
                     index: int, request_id: str, prompt_tokens: int = 0) -> AsyncIterator[Piece]:
    """The choice's text pieces as the model makes them; the last has its finish reason. A refusal or a
    failure of the model raises (its InferdError). ``prompt``: text, or the exact bytes a prompt of token
    ids stands for; ``prompt_tokens``: the prompt's tokens for the core's counter (the first choice of a
    prompt carries them, its other choices 0, as usage counts them)."""
    data = prompt if isinstance(prompt, bytes) else prompt.encode("utf-8")
    request = InferenceRequest(
        model_name=model, id=f"{request_id}-{index}",
        inputs={spec.text_input: np.array([data], dtype=np.object_).reshape(spec.text_shape)},
        parameters=sampling.parameters(index), priority=sampling.priority, received_ns=time.monotonic_ns(),
        openai_prompt_tokens=prompt_tokens, background=sampling.background)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stops = sampling.stop
    hold = max((len(s) for s in stops), default=1) - 1  # text that may be the start of a stop string
    pending = ""
    tokens = 0  # since the last piece
    total = 0
    async with aclosing(dp.infer_stream(request)) as responses:
        async for item in responses:
            if item.error is not None:
                raise item.error
            response = item.response
            if response is not None and spec.text_output in response.outputs:
                tokens += 1
                total += 1
                for value in np.asarray(response.outputs[spec.text_output]).reshape(-1):
                    pending += decoder.decode(value if isinstance(value, bytes) else str(value).encode("utf-8"))
                if stops:
                    found = [(pending.find(s), s) for s in stops if s in pending]
                    if found:
                        at = min(found)[0]
                        # Closing the stream cancels the sequence (its row leaves at the next step); the
                        # request is a success, not a cancellation, in the model's statistics.
                        request.ended_by_client = True
                        yield Piece(index, pending[:at], "stop", tokens)
                        return
                ready = len(pending) - hold if stops else len(pending)
                if ready > 0:
                    yield Piece(index, pending[:ready], None, tokens)
                    pending, tokens = pending[ready:], 0
            if item.final:
                break
    pending += decoder.decode(b"", final=True)
    yield Piece(index, pending, finish_reason(total, sampling, spec), tokens)
