"""The model hosts' protocol pieces, without processes: tensors through an arena, messages through
frames, custom metrics from several hosts merged, and what a host's loop keeps for a batch it has
not read yet."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import msgspec
import numpy as np
import pytest

from inferd.errors import InvalidArgument, ModelExecutionError, Unavailable
from inferd.hosts import protocol as p
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.frames import MAX_FRAME, FrameChannel, FrameReader, FrameWriter
from inferd.observability.custom_metrics import COUNTER, GAUGE, HISTOGRAM, CustomMetrics


@pytest.fixture
def arena() -> ArenaWriter:
    writer = ArenaWriter(Arena.create(1 << 20, "test-hosts"))
    yield writer
    writer.arena.close()


def test_tensors_of_every_kind_go_through_one_block_and_come_back(arena: ArenaWriter) -> None:
    big = np.arange(p.INLINE_BYTES // 4 + 1, dtype=np.float32)  # past what a message carries itself
    first = {"F": big.reshape(1, -1), "S": np.array([b"ab", b"", "c\u00e9"], np.object_)}
    second = {"E": np.zeros((0, 4), np.int64), "B": np.array([[True, False]])}
    block, refs = p.write_tensors(arena, [first, second, {}])
    assert block != p.NO_BLOCK and [len(r) for r in refs] == [2, 2, 0]
    assert all(ref.data is None for group in refs for ref in group)
    one = p.read_tensors(arena.arena, refs[0], "test")
    assert one["F"].tolist() == first["F"].tolist() and not one["F"].flags.writeable  # a view, in place
    assert one["S"].tolist() == [b"ab", b"", "c\u00e9".encode()]
    two = p.read_tensors(arena.arena, refs[1], "test", copy=True)
    assert two["E"].shape == (0, 4) and two["B"].tolist() == [[True, False]]
    arena.free(block)
    assert arena.allocator.in_use() == 0


def test_a_message_of_few_bytes_carries_its_tensors_itself(arena: ArenaWriter) -> None:
    """A small batch takes no block (no allocation, no release message back): its bytes ride in the
    message, and what is read from it is what was written, as a view or as a writable copy."""
    small = {"F": np.arange(6, dtype=np.float32).reshape(2, 3), "S": np.array([b"ab", "c\u00e9"], np.object_)}
    block, refs = p.write_tensors(arena, [small, {"E": np.zeros((0, 2), np.int64)}])
    assert block == p.NO_BLOCK and arena.allocator.in_use() == 0
    sent = p.Execute(1, [p.Row(i, "", {}, None, 0, 0, False, False, r, None) for i, r in enumerate(refs)], [], block, [])
    received = p.to_host(p.encode(sent))
    view = p.read_tensors(arena.arena, received.rows[0].inputs, "test")
    assert view["F"].tolist() == small["F"].tolist() and not view["F"].flags.writeable
    assert view["S"].tolist() == [b"ab", "c\u00e9".encode()]
    own = p.read_tensors(arena.arena, received.rows[0].inputs, "test", copy=True)
    own["F"][0, 0] = 7.0  # an array of its own: the message's bytes are not touched
    assert p.read_tensors(arena.arena, received.rows[0].inputs, "test")["F"][0, 0] == 0.0
    assert p.read_tensors(arena.arena, received.rows[1].inputs, "test")["E"].shape == (0, 2)
    big = {"F": np.zeros(p.INLINE_BYTES // 4 + 1, np.float32)}
    block, refs = p.write_tensors(arena, [big])
    assert block != p.NO_BLOCK and refs[0][0].data is None  # past the limit: through the arena
    arena.free(block)


def test_a_batch_of_empty_requests_takes_no_block(arena: ArenaWriter) -> None:
    block, refs = p.write_tensors(arena, [{}, {}])
    assert block == p.NO_BLOCK and refs == [[], []]


def test_every_message_decodes_into_its_own_type() -> None:
    row = p.Row(7, "id", {"k": 1}, ["OUT"], "seq", 1, False, True, [p.TensorRef("X", "FP32", [1, 2], 64, 8)], None)
    sent = [p.Execute(3, [row], ["OUT"], 128, [0, 64]), p.Cancel(7), p.Credit(7, 8), p.Finalize()]
    assert [p.to_host(p.encode(m)) for m in sent] == sent
    back = [p.Result(3, [[]], [p.Failure("Unavailable", "gone")], p.NO_BLOCK, (1, 2, 3), None, [True], False),
            p.Response(7, True, None, p.NO_BLOCK, None, 5), p.Ignoring(7, 10)]
    assert [p.from_host(p.encode(m)) for m in back] == back
    with pytest.raises(msgspec.ValidationError):  # a host message is no message for the host
        p.to_host(p.encode(p.Ignoring(1, 1)))


def test_a_failure_keeps_its_kind_across_the_boundary() -> None:
    assert isinstance(p.Failure.of(Unavailable("x")).error(), Unavailable)
    assert isinstance(p.Failure.of(InvalidArgument("bad")).error(), InvalidArgument)
    plain = p.Failure.of(ZeroDivisionError("division by zero"))
    assert isinstance(plain.error(), ModelExecutionError) and "ZeroDivisionError" in plain.message
    assert isinstance(p.Failure("NoSuchError", "m").error(), ModelExecutionError)


def test_frames_from_a_thread_reach_the_loop_in_order_and_a_blocking_reader_reads_them() -> None:
    async def main() -> None:
        left, right = socket.socketpair()
        got: list[bytes] = []
        done = asyncio.get_running_loop().create_future()

        def on_frame(data: bytes) -> None:
            got.append(data)
            if len(got) == 300:
                done.set_result(None)

        channel = await FrameChannel.open(left, on_frame, "test")
        writer = FrameWriter(right)
        payloads = [bytes([i % 256]) * (i * 97 % 5000) for i in range(300)]  # splits across reads
        thread = threading.Thread(target=lambda: [writer.send(x) for x in payloads])
        thread.start()
        await asyncio.wait_for(done, 30)
        thread.join()
        assert got == payloads
        # The other way: the channel writes, a blocking reader on a thread reads.
        right.setblocking(True)
        reader = FrameReader(right)
        for x in payloads[:20]:
            channel.send(x)
        read = await asyncio.get_running_loop().run_in_executor(None, lambda: [reader.read() for _ in range(20)])
        assert read == payloads[:20]
        channel.close()
        await channel.closed
        assert await asyncio.get_running_loop().run_in_executor(None, reader.read) is None  # the peer has gone
        right.close()

    asyncio.run(main())


def test_a_frame_over_the_limit_is_refused_before_it_is_sent() -> None:
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match="limit"):
        FrameWriter(a).send(b"x" * (MAX_FRAME + 1))
    a.close()
    b.close()


def test_custom_metrics_of_several_hosts_show_as_one_family_per_name() -> None:
    core, host1, host2 = CustomMetrics(), CustomMetrics(), CustomMetrics()
    for registry, value in ((host1, 2.0), (host2, 3.0)):
        requests = registry.family("model_requests", "requests seen", COUNTER)
        requests.increment(requests.metric({"model": "m"}, None), value)
        temperature = registry.family("model_temperature", "degrees", GAUGE)
        temperature.set(temperature.metric(None, None), value * 10)
        latency = registry.family("model_latency", "seconds", HISTOGRAM)
        latency.observe(latency.metric(None, [0.1, 1.0]), value / 10)
    text = core.exposition([host1.snapshot(), host2.snapshot()])
    assert text.count("# TYPE model_requests counter") == 1
    assert 'model_requests{model="m"} 5' in text  # counters add up
    assert "model_temperature{} 30" in text  # a gauge: the last one read
    assert 'model_latency_bucket{le="0.1"} 0' in text and 'model_latency_bucket{le="1"} 2' in text
    assert "model_latency_count{} 2" in text
    assert core.exposition() == ""  # nothing of its own, nothing from others


def test_a_cancel_or_credit_that_outruns_its_batch_is_kept_for_it(arena: ArenaWriter) -> None:
    """The control link can deliver a request's cancel before the batch link delivers the request:
    the host's sender for it must start cancelled (and with the credit that came early)."""
    from inferd.hosts.runtime import HostRuntime

    async def main() -> None:
        core, host = socket.socketpair()
        host.setblocking(True)
        exits: list[int] = []
        runtime = HostRuntime(arena.arena, arena, FrameReader(host), FrameWriter(host), exit=exits.append)
        runtime.on_message(p.encode(p.Cancel(5)))
        runtime.on_message(p.encode(p.Credit(6, 8)))
        block, refs = p.write_tensors(arena, [{"X": np.ones(1, np.float32)}])
        early = runtime._row(1, p.Row(5, "", {}, None, 0, 0, False, True, refs[0], None))
        credited = runtime._row(1, p.Row(6, "", {}, None, 0, 0, False, True, refs[0], None))
        assert early.request.cancelled and early.request.responder.cancelled
        assert credited.request.responder.credit == p.RESPONSE_WINDOW + 8 and not credited.request.cancelled
        assert runtime.early_cancels == {} and runtime.early_credits == {}
        core.close()  # the core goes: the model thread reads the end of its link and exits
        await asyncio.get_running_loop().run_in_executor(None, runtime._thread.join, 10)
        assert exits == [0]
        host.close()

    asyncio.run(main())


def test_a_host_reads_its_own_footprint_at_its_lowest_priority(arena: ArenaWriter, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """The core asks a host for its footprint (its private memory) once its model is loaded: the host walks
    its own page tables, on a thread at the lowest priority, rather than the core's loader thread at its normal
    priority while warm requests are served."""
    from inferd.hosts import priority, runtime as host_runtime
    from inferd.hosts.runtime import HostRuntime

    seen: list[tuple[int, str]] = []

    def private_bytes(pid: object = "self") -> int:  # what it was called as, and on which thread at what nice
        seen.append((priority.of(threading.get_native_id()), str(pid)))
        return 123 << 20

    monkeypatch.setattr(host_runtime, "private_bytes", private_bytes)

    async def main() -> None:
        core, host = socket.socketpair()
        host.setblocking(True)
        exits: list[int] = []
        runtime = HostRuntime(arena.arena, arena, FrameReader(host), FrameWriter(host), exit=exits.append)
        runtime.on_message(p.encode(p.Ask(7, "footprint")))
        answer = p.from_host(await asyncio.get_running_loop().run_in_executor(None, FrameReader(core).read))
        assert answer == p.Answer(7, 123 << 20, None)
        assert seen == [((priority.LOAD_NICE, priority.LOAD_POLICY), "self")]
        core.close()
        await asyncio.get_running_loop().run_in_executor(None, runtime._thread.join, 10)
        host.close()

    asyncio.run(main())


def test_a_host_that_does_not_answer_for_its_footprint_is_read_by_the_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose loop cannot answer (its model's code holding the GIL) does not hold the load forever:
    past FOOTPRINT_TIMEOUT the core reads the host's private memory from /proc itself."""
    import itertools

    from inferd.hosts import instance as hosted
    from inferd.observability.procfs import private_bytes

    if private_bytes() is None:
        pytest.skip("/proc/<pid>/smaps_rollup cannot be read here")
    monkeypatch.setattr(hosted, "FOOTPRINT_TIMEOUT", 0.05)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    class Silent:  # a host that takes the question and never answers
        def send(self, msg: object) -> None:
            pass

    try:
        instance = object.__new__(hosted.HostedInstance)
        instance.loop, instance.host, instance.pid, instance.rss = loop, Silent(), os.getpid(), 1
        instance._ids, instance._asks = itertools.count(1), {}
        got = instance.footprint()
        assert got > 1 and abs(got - (private_bytes() or 0)) < 64 << 20  # this process's, read here; not the RSS
        assert instance._asks == {}  # the question given up on is not kept
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_an_output_that_cannot_be_written_fails_its_batch_not_the_host(arena: ArenaWriter) -> None:
    """A model's output the host cannot serialize fails that batch with an error naming the model; the
    host's model thread goes on (before, the error escaped it and the host exited)."""
    from inferd.backends.base import BatchResult, ModelInstance
    from inferd.hosts.runtime import HostRuntime

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text for this")

    class Model(ModelInstance):
        wants_requests = False

        def __init__(self) -> None:
            pass

        def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
            return BatchResult([{"OUT": np.array([Unprintable()], dtype=np.object_)} for _ in inputs])

    async def main() -> None:
        core, host = socket.socketpair()
        host.setblocking(True)
        exits: list[int] = []
        runtime = HostRuntime(arena.arena, arena, FrameReader(host), FrameWriter(host), exit=exits.append)
        runtime.name = "unprintable"
        runtime.instance = Model()
        block, refs = p.write_tensors(arena, [{"X": np.ones(1, np.float32)}])
        result = runtime._execute(p.Execute(1, [p.Row(2, "", {}, None, 0, 0, False, False, refs[0], None)],
                                            ["OUT"], block, []))
        error = result.failures[0].error()
        assert isinstance(error, ModelExecutionError) and "model 'unprintable'" in str(error)
        assert "no text for this" in str(error)
        core.close()
        await asyncio.get_running_loop().run_in_executor(None, runtime._thread.join, 10)
        assert exits == [0]  # it ended because the core went, not on the output
        host.close()

    asyncio.run(main())


def test_bytes_elements_that_are_not_text_are_their_str_as_in_triton() -> None:
    from inferd.dtypes import decode_bytes, encode_bytes

    values = np.array([5, -3, 1.5, b"x", "y", bytearray(b"z"), np.int32(7)], dtype=np.object_)
    assert list(decode_bytes(encode_bytes(values), len(values), "test")) == [
        b"5", b"-3", b"1.5", b"x", b"y", b"z", b"7"]
