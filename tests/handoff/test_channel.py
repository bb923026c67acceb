"""inferd.ipc.channel: ordered delivery, one socket write per loop turn, close on either side."""

from __future__ import annotations

import asyncio
import io

import msgpack
import pytest

from inferd.ipc.channel import Channel, socket_pair


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
    a = await Channel.open(sa, on_a, "a")
    b = await Channel.open(sb, on_b, "b")
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

    channel = Channel(answer)
    transport = Transport()
    channel.connection_made(transport)
    channel.data_received(b"".join(msgpack.packb(["ask", i]) for i in range(3)))
    assert seen_more == [True, True, False]  # more: others of the same read follow
    assert len(transport.written) == 1  # already written, not a loop turn later
    assert list(msgpack.Unpacker(io.BytesIO(transport.written[0]))) == [["answer", i] for i in range(3)]
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
        peer.sendall(msgpack.packb(["config", 1]) + msgpack.packb(["state", 2]))
        seen: list = []
        channel: Channel | None = None

        def handle(msg) -> None:  # type: ignore[no-untyped-def]
            assert channel is not None, f"{msg} delivered before open() returned"
            seen.append(msg)
            channel.send(["ack", msg[1]])

        channel = await Channel.open(ours, handle, "early")
        for _ in range(200):  # both delivered, within 2 s
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        peer.settimeout(5)
        unpacker, acks = msgpack.Unpacker(), []
        while len(acks) < 2:  # the handler's answers reached the peer
            unpacker.feed(peer.recv(1024))
            acks.extend(unpacker)
        channel.close()
        peer.close()
        return seen, acks

    seen, acks = event_loop.run(scenario(), kind)
    assert seen == [["config", 1], ["state", 2]]  # both, in order, once the caller held the channel
    assert acks == [["ack", 1], ["ack", 2]]
