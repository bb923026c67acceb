"""The core's endpoint for a frontend worker: every INFER gets a final answer, even one whose CANCEL
arrives in the same channel read (before the request's task has started)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from inferd.handoff import endpoint as ep
from inferd.handoff import wire


class _Channel:
    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send(self, message: list[Any]) -> None:
        self.sent.append(message)


class _Plane:
    def __init__(self) -> None:
        self.started = 0

    async def infer(self, request: Any, decoupled_error: str, carrier: Any) -> Any:
        self.started += 1
        await asyncio.sleep(60)


def _infer_message(rid: int) -> list[Any]:
    msg: list[Any] = [None] * (wire.I_TRACE + 1)
    msg[0], msg[wire.I_RID], msg[wire.I_FLAGS] = wire.INFER, rid, 0
    return msg


@pytest.fixture
async def endpoint(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ep, "request_from", lambda msg, inputs: SimpleNamespace(cancelled=False))
    channel = _Channel()
    link = SimpleNamespace(channel=channel, inputs=None, outputs=None, index=0)
    return ep.CoreEndpoint(link, _Plane(), lambda *a: None), channel  # type: ignore[arg-type]


async def test_a_cancel_read_with_its_infer_still_gets_the_final_answer(endpoint) -> None:  # type: ignore[no-untyped-def]
    core, channel = endpoint
    core.on_message(_infer_message(7))
    core.on_message([wire.CANCEL, 7])  # same read: the task has not started
    for _ in range(5):
        await asyncio.sleep(0)
    assert channel.sent == [[wire.ERROR, 7, True, "Cancelled", ep.CANCELLED]]
    assert core.tasks == {} and core.dp.started == 0


async def test_a_cancel_after_the_start_is_answered_once(endpoint) -> None:  # type: ignore[no-untyped-def]
    core, channel = endpoint
    core.on_message(_infer_message(8))
    await asyncio.sleep(0)  # the request reached the data plane
    core.on_message([wire.CANCEL, 8])
    for _ in range(5):
        await asyncio.sleep(0)
    assert channel.sent == [[wire.ERROR, 8, True, "Cancelled", ep.CANCELLED]]
    assert core.tasks == {} and core.dp.started == 1
