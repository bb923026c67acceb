"""inferd.handoff.messages: every message decodes, on the side that receives it, to the struct it was sent as;
on the wire it is the compact msgpack array a hand-written list would be; and each kind is built in one module."""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest

from inferd.handoff import messages as m

INFER = m.Infer(rid=7, model="simple", version="2", id="req-1", parameters={"priority": 1, "flag": True},
                inputs=[m.InputTensor("INPUT0", "FP32", [1, 4], 4096, 16, None),
                        m.InputTensor("INPUT1", "FP32", [1, 4], m.NOT_IN_ARENA, 0, {"shared_memory_region": "r"})],
                outputs=[m.OutputRequest("OUTPUT0", {"classification": 2})], flags=m.STREAM | m.HTTP, deadline=12.5,
                trace={"traceparent": "00-ab-cd-01"}, received=123_456_789, openai_prompt_tokens=5,
                frontend=m.FrontendStamp("grpc", 123_456_999))
RESPONSE = m.Response(rid=7, final=True, model="simple", version=2, id="req-1",
                      outputs=[m.OutputTensor("OUTPUT0", "FP32", [1, 4], 8192, 16)], parameters={"p": "v"}, block=8192)
TO_CORE = [m.Hello(0, 4242), INFER, m.Cancel(7), m.Free([4096, 8192]), m.Call(1, "model_ready", b"\x80\x05"),
           m.Credit(7, 16), m.Sent(7, 1, 2), m.Sent(8, None, None), m.Refused(3)]
TO_WORKER = [m.Config({"index": 0, "inputs": [5, 1 << 20], "state": {"tracing": False}}), RESPONSE,
             m.Error(7, True, "NotFound", "model 'x' is not found"), m.Final(7), m.Reply(1, b"\x80\x05N.", "", ""),
             m.Reply(2, None, "InvalidArgument", "bad"), m.Drain(30.0), m.State(True), m.Close(), m.Recycle(30.0)]


@pytest.mark.parametrize(("sent", "union"), [(TO_CORE, m.ToCore), (TO_WORKER, m.ToWorker)],
                         ids=["to core", "to worker"])
def test_each_message_decodes_to_the_struct_it_was_sent_as(sent: list, union: object) -> None:
    decoded = msgspec.msgpack.Decoder(list[union]).decode(msgspec.msgpack.encode(sent))  # type: ignore[valid-type]
    assert decoded == sent
    assert [type(d) for d in decoded] == [type(s) for s in sent]


def test_a_side_refuses_a_message_only_the_other_side_receives() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(m.ToCore).decode(msgspec.msgpack.encode(RESPONSE))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(m.ToWorker).decode(msgspec.msgpack.encode(INFER))


def test_every_kind_has_its_own_tag_and_belongs_to_one_direction() -> None:
    to_core, to_worker = set(m.ToCore.__args__), set(m.ToWorker.__args__)
    assert not to_core & to_worker
    kinds = to_core | to_worker
    tags = [k.__struct_config__.tag for k in kinds]
    assert len(set(tags)) == len(tags) == 17
    assert all(isinstance(t, int) for t in tags)
    assert {type(x) for x in TO_CORE} == to_core and {type(x) for x in TO_WORKER} == to_worker  # all tested


def test_on_the_wire_a_message_is_the_array_a_hand_written_list_would_be() -> None:
    # Positions follow the fields' order, the kind first: as compact as the lists the structs replaced.
    packb = msgspec.msgpack.encode
    assert msgspec.msgpack.encode(INFER) == packb(
        [1, 7, "simple", "2", "req-1", {"priority": 1, "flag": True},
         [["INPUT0", "FP32", [1, 4], 4096, 16, None], ["INPUT1", "FP32", [1, 4], -1, 0, {"shared_memory_region": "r"}]],
         [["OUTPUT0", {"classification": 2}]], 3, 12.5, {"traceparent": "00-ab-cd-01"}, 123_456_789, 5,
         ["grpc", 123_456_999]])
    assert msgspec.msgpack.encode(RESPONSE) == packb(
        [17, 7, True, "simple", 2, "req-1", [["OUTPUT0", "FP32", [1, 4], 8192, 16]], {"p": "v"}, 8192])
    assert msgspec.msgpack.encode(m.Free([1, 2])) == packb([3, [1, 2]]) == b"\x92\x03\x92\x01\x02"
    assert msgspec.msgpack.encode(m.Close()) == packb([23]) == b"\x91\x17"


def test_a_final_message_says_so_whatever_its_kind() -> None:
    assert m.Final(1).final and RESPONSE.final
    assert not m.Error(1, False, "ModelExecutionError", "one of many").final
    assert "final" not in m.Final.__struct_fields__  # not on the wire: Final is final


INFERD = Path(m.__file__).resolve().parents[1]
# Where each kind is built: one module each (the module and, for the core's answers, the function).
BUILT_IN = {
    "Hello": {"handoff/worker/core_link.py"}, "Infer": {"handoff/worker/core_link.py"},
    "Cancel": {"handoff/worker/core_link.py"}, "Free": {"handoff/worker/core_link.py"},
    "Call": {"handoff/worker/core_link.py"}, "Credit": {"handoff/worker/core_link.py"},
    "Sent": {"handoff/worker/core_link.py"}, "Refused": {"handoff/worker/core_link.py"},
    "Config": {"serve/supervisor.py"}, "Response": {"handoff/core/endpoint.py"},
    "Error": {"handoff/core/endpoint.py"}, "Final": {"handoff/core/endpoint.py"},
    "Reply": {"handoff/core/endpoint.py"}, "Drain": {"serve/supervisor.py"}, "State": {"serve/core_process.py"},
    "Close": {"serve/supervisor.py"},
}


def _builders() -> dict[str, set[str]]:
    """Message kind -> the inferd modules that call its constructor (imported from inferd.handoff.messages)."""
    found: dict[str, set[str]] = {}
    for path in INFERD.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.asname or a.name: a.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module == "inferd.handoff.messages"
                 for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                kind = names[node.func.id]
                if kind in BUILT_IN:
                    found.setdefault(kind, set()).add(str(path.relative_to(INFERD)))
    return found


def test_each_message_kind_is_built_in_one_place() -> None:
    assert _builders() == BUILT_IN
