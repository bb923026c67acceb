"""inferd.serve.worker_process: a worker's /v1 Batch API calls go to the core, which owns the batches."""

from __future__ import annotations

import inspect
from typing import Any

from inferd.dataplane.plane import DataPlane
from inferd.facade import OPENAI_BATCH_CALLS, OpenAIBatchAPI
from inferd.handoff.messages import CALLS
from inferd.serve.worker_process import ForwardedBatches


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(v) for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_forwarder_is_the_batch_api_and_the_core_answers_exactly_its_calls() -> None:
    api, forwarded, core = _methods(OpenAIBatchAPI), _methods(ForwardedBatches), _methods(DataPlane)
    assert set(api) == set(forwarded) == OPENAI_BATCH_CALLS
    for name, signature in api.items():
        assert list(signature.parameters) == list(forwarded[name].parameters) == list(core[name].parameters), name
    assert OPENAI_BATCH_CALLS <= CALLS  # the core answers them for a worker


async def test_each_call_is_sent_under_its_own_name_with_its_arguments() -> None:
    sent: list[tuple[str, tuple[Any, ...]]] = []

    class Link:  # the worker's CoreLink, as far as the forwarder uses it
        async def call(self, method: str, *args: Any) -> Any:
            sent.append((method, args))
            return {"answered": method}

    forwarded = ForwardedBatches(Link())  # type: ignore[arg-type]
    for name, signature in _methods(OpenAIBatchAPI).items():
        args = tuple(f"{name}-{p}" for p in list(signature.parameters)[1:])
        assert await getattr(forwarded, name)(*args) == {"answered": name}
        assert sent[-1] == (name, args)
