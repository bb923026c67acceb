"""A frontend's requests in flight (inferd.handoff.worker.core_link.InFlight): output blocks go back to the core
with the frontend's next write, never in a wake-up of their own unless they hold much."""

from __future__ import annotations

import asyncio

from typing import Any

from inferd.handoff.messages import (
    NO_BLOCK, Cancel, Free, Infer, OutputTensor, Response, ToCore, ToWorker,
)
from inferd.handoff.worker.core_link import FREE_BATCH, InFlight
from inferd.ipc.arena import RELEASE_BYTES, Arena, ArenaWriter
from inferd.ipc.channel import Channel, socket_pair


class Core:
    """The core's end: the messages it receives, and for each whether others of its read followed."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.more: list[bool] = []
        self.channel: Channel | None = None

    def __call__(self, msg: Any) -> None:
        self.messages.append(msg)
        assert self.channel is not None
        self.more.append(self.channel.more)


async def _frontend():  # type: ignore[no-untyped-def]
    a, b = socket_pair()
    core = Core()
    core_end = core.channel = await Channel.open(b, core, "core", receives=ToCore)
    frontend_pending: list[InFlight] = []
    channel = await Channel.open(a, lambda msg: frontend_pending[0].on_response(msg), "frontend", receives=ToWorker)
    pending = InFlight(channel, ArenaWriter(Arena.create(1 << 20)))
    frontend_pending.append(pending)
    return pending, core, core_end, channel


def response(rid: int, block: int, nbytes: int) -> Response:
    outputs = [OutputTensor("OUTPUT0", "FP32", [nbytes // 4], block, nbytes)] if block != NO_BLOCK else []
    return Response(rid=rid, final=True, model="m", version=1, id="", outputs=outputs, parameters=None, block=block)


def infer(rid: int) -> Infer:
    return Infer(rid=rid, model="m", version="", id="", parameters=None, inputs=[], outputs=None, flags=0,
                 deadline=None, trace=None, received=0, openai_prompt_tokens=None, frontend=None)


def kinds(messages: list[Any]) -> list[type]:
    return [type(m) for m in messages]


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_an_idle_frontend_holds_small_freed_blocks_until_its_next_request() -> None:
    pending, core, core_end, channel = await _frontend()
    fut = pending.unary(infer(1), NO_BLOCK)
    await turns()
    assert kinds(core.messages) == [Infer]
    pending.on_response(response(1, 4096, 64))
    pending.release(await fut)  # nothing in flight now
    await turns()
    assert kinds(core.messages) == [Infer]  # no write for the free alone
    writes = channel.writes
    pending.unary(infer(2), NO_BLOCK)
    await turns()
    # In the request's own write and ahead of it: the request ends its read (Channel.more false
    # there), so the core's batcher may run a lone request at once instead of waiting for company.
    assert core.messages[1:] == [Free([4096]), infer(2)]
    assert core.more[1:] == [True, False]
    assert channel.writes == writes + 1
    channel.close()
    core_end.close()


async def test_an_idle_frontend_sends_large_blocks_back_at_once_and_many_blocks_go_back_unasked() -> None:
    pending, core, core_end, channel = await _frontend()
    fut = pending.unary(infer(1), NO_BLOCK)
    pending.on_response(response(1, 0, RELEASE_BYTES))
    pending.release(await fut)
    await turns()
    assert core.messages[-1] == Free([0])  # the core gives its pages back to the kernel
    for i in range(FREE_BATCH):
        pending.release(response(0, 64 * i, 64))
    await turns()
    assert core.messages[-1] == Free([64 * i for i in range(FREE_BATCH)])
    channel.close()
    core_end.close()


async def test_a_lone_request_is_written_at_once_and_a_burst_in_one_write() -> None:
    pending, core, core_end, channel = await _frontend()
    pending.unary(infer(1), NO_BLOCK)
    assert channel.writes == 1  # the only request in flight: no loop turn to wait for
    for rid in (2, 3, 4):  # the others of a burst wait for the turn's one write
        pending.unary(infer(rid), NO_BLOCK)
    assert channel.writes == 1
    await turns()
    assert channel.writes == 2 and [m.rid for m in core.messages] == [1, 2, 3, 4]
    channel.close()
    core_end.close()


async def test_a_write_made_at_once_leaves_the_turns_deferred_write_nothing_to_send_alone() -> None:
    pending, core, core_end, channel = await _frontend()
    fut = pending.unary(infer(1), NO_BLOCK)
    pending.on_response(response(1, 4096, 64))
    reply = await fut
    await turns(1)  # a later turn than the answer's: a lone request again
    channel.send(Cancel(1))  # deferred to the turn's end
    pending.unary(infer(2), NO_BLOCK)  # at once: takes the CANCEL along
    writes = channel.writes
    pending.release(reply)  # a small block freed after that write: it waits for the next request
    await turns()
    assert channel.writes == writes and kinds(core.messages) == [Infer, Cancel, Infer]
    channel.close()
    core_end.close()


async def test_requests_sent_by_handlers_their_answers_woke_go_in_one_write() -> None:
    pending, core, core_end, channel = await _frontend()
    futs = [pending.unary(infer(rid), NO_BLOCK) for rid in (1, 2, 3)]
    await turns()
    writes = channel.writes

    async def again(fut: asyncio.Future, rid: int) -> None:
        await fut  # woken by the answer, in the turn after the read that carried them all
        pending.unary(infer(rid), NO_BLOCK)

    clients = [asyncio.ensure_future(again(f, rid)) for f, rid in zip(futs, (4, 5, 6))]
    await turns(1)
    channel.more = True  # as Channel.data_received delivers one read's messages
    for rid in (1, 2):
        pending.on_response(response(rid, NO_BLOCK, 0))
    channel.more = False
    pending.on_response(response(3, NO_BLOCK, 0))
    await asyncio.gather(*clients)
    await turns()
    # Nothing was in flight when the first of them sent, yet the three go in one write, not 1 + 2.
    assert channel.writes == writes + 1 and [m.rid for m in core.messages[3:]] == [4, 5, 6]
    channel.close()
    core_end.close()
