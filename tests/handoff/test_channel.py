"""inferd.ipc.channel: ordered delivery, one socket write per loop turn (one frame), close on either side,
any message type decoded (plain values here; the hand-off's structs in tests/handoff/test_messages.py)."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import msgspec
import pytest

from inferd.ipc.channel import MAX_FRAME, Channel, socket_pair


def frame(*messages: Any) -> bytes:
    """One write as the channel frames it: its length (4 bytes, big-endian), then the messages as one
    msgpack array (array32: 0xdd and the count)."""
    body = b"".join(msgspec.msgpack.encode(m) for m in messages)
    return struct.pack(">IBI", 5 + len(body), 0xDD, len(messages)) + body


def unframe(data: bytes) -> list[list[Any]]:
    """Each frame's messages, for frames written back to back."""
    frames, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">I", data, at)
        frames.append(msgspec.msgpack.decode(data[at + 4:at + 4 + size]))
        at += 4 + size
    return frames


class Collector:
    """Messages received; ``await wait(n)`` returns once ``n`` have come."""

    def __init__(self) -> None:
        self.messages: list = []
        self._changed = asyncio.Event()

    def __call__(self, msg) -> None:  # type: ignore[no-untyped-def]
        self.messages.append(msg)
        self._changed.set()

    async def wait(self, n: int) -> list:
        async def until() -> None:
            while len(self.messages) < n:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(until(), 10)
        return self.messages


async def _pair(on_a, on_b):  # type: ignore[no-untyped-def]
    sa, sb = socket_pair()
    a = await Channel.open(sa, on_a, "a", receives=Any)
    b = await Channel.open(sb, on_b, "b", receives=Any)
    return a, b


async def test_messages_of_one_turn_arrive_in_order_in_one_write() -> None:
    received = Collector()
    a, b = await _pair(lambda m: None, received)
    for i in range(200):
        a.send([1, i, "model", {"p": True}, [["INPUT0", "FP32", [1, 16], 4096, 64, None]], b"\x00\x01", 1.5])
    assert a.writes == 0  # nothing is written before the turn ends
    got = await received.wait(200)
    assert [m[1] for m in got] == list(range(200))
    assert got[0] == [1, 0, "model", {"p": True}, [["INPUT0", "FP32", [1, 16], 4096, 64, None]], b"\x00\x01", 1.5]
    assert a.writes == 1 and a.sent == 200
    a.close()
    b.close()


async def test_messages_of_successive_turns_take_one_write_each_and_large_batches_split_on_read() -> None:
    received = Collector()
    a, b = await _pair(lambda m: None, received)
    for turn in range(3):
        for i in range(2000):
            a.send([turn, i, "x" * 100])
        await asyncio.sleep(0)  # the turn ends
    got = await received.wait(6000)
    assert len(got) == 6000 and got[-1][:2] == [2, 1999]
    assert a.writes == 3
    a.close()
    b.close()


async def test_before_flush_hooks_add_to_the_same_write() -> None:
    received = Collector()
    freed: list[int] = []
    a, b = await _pair(lambda m: None, received)

    def add_free() -> None:
        if freed:
            a.send([3, list(freed)])
            freed.clear()

    a.before_flush(add_free)
    freed += [64, 128]
    a.wake()
    assert await received.wait(1) == [[3, [64, 128]]] and a.writes == 1
    a.close()
    b.close()


async def test_peer_closing_resolves_closed_and_later_sends_are_dropped() -> None:
    a, b = await _pair(lambda m: None, lambda m: None)
    b.close()
    await asyncio.wait_for(a.closed, 5)  # type: ignore[arg-type]
    a.send([1, 2, 3])  # no error: the peer is gone
    assert a.sent == 0


async def test_a_failing_handler_does_not_stop_the_channel(caplog: pytest.LogCaptureFixture) -> None:
    received = Collector()

    def on_b(msg):  # type: ignore[no-untyped-def]
        if msg[0] == "bad":
            raise RuntimeError("boom")
        received(msg)

    a, b = await _pair(lambda m: None, on_b)
    a.send(["bad"])
    a.send(["good"])
    assert await received.wait(1) == [["good"]]
    assert "failed to handle a control message" in caplog.text
    a.close()
    b.close()


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data) -> None:  # type: ignore[no-untyped-def]
        self.written.append(bytes(data))


async def test_answers_to_one_read_go_out_in_one_write_as_its_handling_ends() -> None:
    channel: Channel
    seen_more: list[bool] = []

    def answer(msg) -> None:  # type: ignore[no-untyped-def]
        seen_more.append(channel.more)
        channel.send(["answer", msg[1]])

    channel = Channel(answer, receives=Any)
    transport = Transport()
    channel.connection_made(transport)
    channel.data_received(frame(["ask", 0], ["ask", 1]) + frame(["ask", 2]))  # two frames in one read
    assert seen_more == [True, True, False]  # more: others of the same read follow
    assert len(transport.written) == 1  # already written, not a loop turn later
    assert unframe(transport.written[0]) == [[["answer", i] for i in range(3)]]
    channel.send(["later", 0])  # outside a read: written as the turn ends
    assert len(transport.written) == 1
    await asyncio.sleep(0)
    assert len(transport.written) == 2 and channel.writes == 2


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_what_arrives_before_open_returns_waits_until_the_caller_holds_the_channel(kind: str) -> None:
    # uvloop reads the socket inside connect_accepted_socket: a handler that uses the channel
    # open() returns (the worker's, answering the core's CONFIG) must not run before it has it.
    if kind == "uvloop":
        pytest.importorskip("uvloop")
    from inferd import event_loop

    async def scenario() -> tuple[list, list]:
        ours, peer = socket_pair()
        peer.sendall(frame(["config", 1], ["state", 2]))
        seen: list = []
        channel: Channel | None = None

        def handle(msg) -> None:  # type: ignore[no-untyped-def]
            assert channel is not None, f"{msg} delivered before open() returned"
            seen.append(msg)
            channel.send(["ack", msg[1]])

        channel = await Channel.open(ours, handle, "early", receives=Any)
        for _ in range(200):  # both delivered, within 2 s
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        peer.settimeout(5)
        data, acks = b"", []
        while len(acks) < 2:  # the handler's answers reached the peer
            data += peer.recv(1024)
            try:
                acks = [m for f in unframe(data) for m in f]
            except (struct.error, msgspec.DecodeError):  # a frame not all here yet
                continue
        channel.close()
        peer.close()
        return seen, acks

    seen, acks = event_loop.run(scenario(), kind)
    assert seen == [["config", 1], ["state", 2]]  # both, in order, once the caller held the channel
    assert acks == [["ack", 1], ["ack", 2]]


async def test_a_frame_split_over_reads_is_delivered_once_whole() -> None:
    received = Collector()
    channel = Channel(received, receives=Any)
    channel.connection_made(Transport())
    data = frame(["first", b"x" * 1000]) + frame(["second", 2], ["third", 3])
    for at in range(0, len(data), 7):  # 7 bytes a read: lengths and messages cut anywhere
        channel.data_received(data[at:at + 7])
    assert received.messages == [["first", b"x" * 1000], ["second", 2], ["third", 3]]
    assert channel.received == 3


async def test_a_message_that_cannot_be_encoded_leaves_the_turns_others_intact() -> None:
    received = Collector()
    a, b = await _pair(lambda m: None, received)
    a.send(["before", 1])
    with pytest.raises(TypeError):
        a.send(["bad", object()])
    a.send(["after", 2])
    assert await received.wait(2) == [["before", 1], ["after", 2]]
    assert a.sent == 2
    a.close()
    b.close()


class Hello(msgspec.Struct, array_like=True, tag=0):
    pid: int


class Bye(msgspec.Struct, array_like=True, tag=1):
    pass


async def test_messages_decode_to_the_type_the_receiver_names() -> None:
    received = Collector()
    sa, sb = socket_pair()
    a = await Channel.open(sa, lambda m: None, "a", receives=Any)
    b = await Channel.open(sb, received, "b", receives=Hello | Bye)
    a.send(Hello(7))
    a.send(Bye())
    assert await received.wait(2) == [Hello(7), Bye()]
    a.close()
    b.close()


@pytest.mark.parametrize("what", ["undecodable", "oversized"])
async def test_a_peer_that_sends_what_no_peer_sends_is_logged_and_the_channel_closed(
        what: str, caplog: pytest.LogCaptureFixture) -> None:
    received = Collector()
    ours, peer = socket_pair()
    channel = await Channel.open(ours, received, "strict", receives=Hello | Bye)
    bad = frame([9, "no such kind"]) if what == "undecodable" else struct.pack(">I", MAX_FRAME + 1)
    peer.sendall(frame([0, 3]) + bad)
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(channel.closed, 5)  # type: ignore[arg-type]
    assert received.messages == [Hello(3)]  # what came before it was delivered
    assert "strict: the peer sent a frame" in caplog.text
    assert ("does not decode" if what == "undecodable" else f"over the {MAX_FRAME}") in caplog.text
    peer.close()
