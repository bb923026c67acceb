"""Wire compatibility of proto/*.proto with Triton's, as shipped in tritonclient.

tritonclient's descriptors are dumped in a subprocess, so this never depends on
protobuf's default pool (which holds tritonclient's ``inference.*`` symbols,
while ours live in the private pool of ``inferd._proto._pool``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")

REPO_ROOT = Path(__file__).resolve().parent.parent

# Turns file descriptors into plain JSON-able data. Run here on our modules, and
# in a fresh interpreter on tritonclient's.
_DUMP_SOURCE = textwrap.dedent(
    '''
    def dump_files(file_descriptors):
        from google.protobuf import descriptor_pb2

        type_names = descriptor_pb2.FieldDescriptorProto.Type

        def label(f):
            if hasattr(f, "is_repeated"):  # protobuf >= 6 deprecates .label
                return "repeated" if f.is_repeated else ("required" if f.is_required else "optional")
            return {1: "optional", 2: "required", 3: "repeated"}[f.label]

        def field(f):
            sub = f.message_type or f.enum_type
            oneof = f.containing_oneof
            return {
                "number": f.number,
                "type": type_names.Name(f.type),
                "label": label(f),
                "type_name": sub.full_name if sub is not None else "",
                "oneof": oneof.name if oneof is not None else None,
                "json_name": f.json_name,
                "has_presence": getattr(f, "has_presence", None),
            }

        def enum(e, out):
            out["enums"][e.full_name] = {v.name: v.number for v in e.values}

        def message(m, out):
            out["messages"][m.full_name] = {
                "map_entry": m.GetOptions().map_entry,
                "oneofs": sorted(o.name for o in m.oneofs),
                "fields": {f.name: field(f) for f in m.fields},
            }
            for e in m.enum_types:
                enum(e, out)
            for n in m.nested_types:
                message(n, out)

        result = {}
        for fd in file_descriptors:
            out = {
                "package": fd.package,
                "dependencies": sorted(d.name for d in fd.dependencies),
                "messages": {},
                "enums": {},
                "services": {},
            }
            for e in fd.enum_types_by_name.values():
                enum(e, out)
            for m in fd.message_types_by_name.values():
                message(m, out)
            for s in fd.services_by_name.values():
                out["services"][s.full_name] = {
                    m.name: {
                        "input_type": m.input_type.full_name,
                        "output_type": m.output_type.full_name,
                        "client_streaming": m.client_streaming,
                        "server_streaming": m.server_streaming,
                    }
                    for m in s.methods
                }
            result[fd.name] = out
        return result
    '''
)

_TRITON_DUMP = (
    _DUMP_SOURCE
    + textwrap.dedent(
        """
        import json
        from tritonclient.grpc import model_config_pb2, service_pb2
        print(json.dumps(dump_files([model_config_pb2.DESCRIPTOR, service_pb2.DESCRIPTOR])))
        """
    )
)


def _dump_files(file_descriptors: list[Any]) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(_DUMP_SOURCE, namespace)
    # JSON round trip so both sides have the same shape (e.g. int keys/values).
    return json.loads(json.dumps(namespace["dump_files"](file_descriptors)))


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )


@pytest.fixture(scope="module")
def triton_dump() -> dict[str, Any]:
    proc = _run_python(_TRITON_DUMP)
    assert proc.returncode == 0, f"dumping tritonclient's descriptors failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def our_dump() -> dict[str, Any]:
    from inferd._proto import grpc_service_pb2, model_config_pb2

    return _dump_files([model_config_pb2.DESCRIPTOR, grpc_service_pb2.DESCRIPTOR])


def _diff_named(
    kind: str, theirs: dict[str, Any], ours: dict[str, Any], compare, out: list[str], prefix: str = ""
) -> None:
    for name in sorted(theirs.keys() - ours.keys()):
        out.append(f"{kind} {prefix}{name}: missing in ours")
    for name in sorted(ours.keys() - theirs.keys()):
        out.append(f"{kind} {prefix}{name}: not in Triton's")
    for name in sorted(theirs.keys() & ours.keys()):
        compare(name, theirs[name], ours[name], out)


def _diff_values(where: str, theirs: dict[str, Any], ours: dict[str, Any], out: list[str]) -> None:
    for key in sorted(theirs.keys() | ours.keys()):
        if theirs.get(key) != ours.get(key):
            out.append(f"{where}: {key} is {ours.get(key)!r} in ours, {theirs.get(key)!r} in Triton's")


def _diff_message(name: str, theirs: dict[str, Any], ours: dict[str, Any], out: list[str]) -> None:
    _diff_values(f"message {name}", {k: v for k, v in theirs.items() if k != "fields"},
                 {k: v for k, v in ours.items() if k != "fields"}, out)

    def field(fname: str, t: dict[str, Any], o: dict[str, Any], out: list[str]) -> None:
        _diff_values(f"field {name}.{fname}", t, o, out)

    _diff_named("field", theirs["fields"], ours["fields"], field, out, prefix=f"{name}.")


def _diff_enum(name: str, theirs: dict[str, int], ours: dict[str, int], out: list[str]) -> None:
    _diff_values(f"enum {name}", theirs, ours, out)


def _diff_service(name: str, theirs: dict[str, Any], ours: dict[str, Any], out: list[str]) -> None:
    def method(mname: str, t: dict[str, Any], o: dict[str, Any], out: list[str]) -> None:
        _diff_values(f"rpc {name}.{mname}", t, o, out)

    _diff_named("rpc", theirs, ours, method, out, prefix=f"{name}.")


def _diff_file(name: str, theirs: dict[str, Any], ours: dict[str, Any], out: list[str]) -> None:
    _diff_values(f"file {name}", {k: theirs[k] for k in ("package", "dependencies")},
                 {k: ours[k] for k in ("package", "dependencies")}, out)
    _diff_named("message", theirs["messages"], ours["messages"], _diff_message, out)
    _diff_named("enum", theirs["enums"], ours["enums"], _diff_enum, out)
    _diff_named("service", theirs["services"], ours["services"], _diff_service, out)


def test_descriptors_match_triton(triton_dump: dict[str, Any], our_dump: dict[str, Any]) -> None:
    assert set(triton_dump) == {"model_config.proto", "grpc_service.proto"}
    differences: list[str] = []
    _diff_named("file", triton_dump, our_dump, _diff_file, differences)
    assert not differences, "proto/*.proto differ from Triton's:\n  " + "\n  ".join(differences)


def test_dump_is_not_vacuous(our_dump: dict[str, Any]) -> None:
    service = our_dump["grpc_service.proto"]["services"]["inference.GRPCInferenceService"]
    assert len(service) == 20
    assert service["ModelStreamInfer"]["client_streaming"] and service["ModelStreamInfer"]["server_streaming"]
    fields = our_dump["grpc_service.proto"]["messages"]["inference.ModelInferRequest"]["fields"]
    assert fields["raw_input_contents"] == {
        "number": 7,
        "type": "TYPE_BYTES",
        "label": "repeated",
        "type_name": "",
        "oneof": None,
        "json_name": "rawInputContents",
        "has_presence": False,
    }
    assert len(our_dump["model_config.proto"]["messages"]) > 40


def _triton_infer_request():
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="simple", model_version="1", id="req-1")
    req.parameters["sequence_id"].int64_param = 42
    req.parameters["sequence_start"].bool_param = True
    req.parameters["priority"].uint64_param = 2
    tensor = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = "region"
    req.inputs.add(name="INPUT1", datatype="INT32", shape=[2]).contents.int_contents.extend([7, -8])
    req.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 3
    req.raw_input_contents.append(bytes(range(16)))
    return req


def test_triton_infer_request_parses_and_round_trips() -> None:
    from inferd._proto import grpc_service_pb2

    theirs = _triton_infer_request()
    wire = theirs.SerializeToString(deterministic=True)

    ours = grpc_service_pb2.ModelInferRequest.FromString(wire)
    assert ours.model_name == "simple" and ours.model_version == "1" and ours.id == "req-1"
    assert ours.parameters["sequence_id"].int64_param == 42
    assert ours.parameters["sequence_start"].WhichOneof("parameter_choice") == "bool_param"
    assert ours.parameters["priority"].uint64_param == 2
    assert [t.name for t in ours.inputs] == ["INPUT0", "INPUT1"]
    assert list(ours.inputs[0].shape) == [1, 4]
    assert ours.inputs[0].parameters["shared_memory_region"].string_param == "region"
    assert list(ours.inputs[1].contents.int_contents) == [7, -8]
    assert ours.outputs[0].parameters["classification"].int64_param == 3
    assert list(ours.raw_input_contents) == [bytes(range(16))]

    # Byte-identical re-serialization: nothing was dropped or kept as unknown.
    assert ours.SerializeToString(deterministic=True) == wire
    assert type(theirs).FromString(ours.SerializeToString()) == theirs


def test_model_config_and_response_round_trip() -> None:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2 as triton_mc
    from tritonclient.grpc import service_pb2 as triton_svc

    from inferd._proto import grpc_service_pb2, model_config_pb2

    config_text = """
        name: "m" backend: "onnxruntime" max_batch_size: 8
        input { name: "IN" data_type: TYPE_FP32 dims: [ -1, 4 ] }
        output { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] }
        dynamic_batching {
          preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100
          priority_queue_policy { key: 1 value { timeout_action: DELAY max_queue_size: 3 } }
        }
        instance_group { kind: KIND_CPU count: 2 }
        parameters { key: "k" value { string_value: "v" } }
        version_policy { specific { versions: [ 1, 3 ] } }
    """
    ours = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    theirs = text_format.Parse(config_text, triton_mc.ModelConfig())
    assert triton_mc.ModelConfig.FromString(ours.SerializeToString()) == theirs
    assert model_config_pb2.ModelConfig.FromString(theirs.SerializeToString()) == ours
    assert json_format.MessageToDict(ours) == json_format.MessageToDict(theirs)

    response = grpc_service_pb2.ModelInferResponse(model_name="m", id="r")
    out = response.outputs.add(name="OUT", datatype="INT64", shape=[1, 1])
    out.parameters["binary_data_size"].int64_param = 8
    response.raw_output_contents.append((5).to_bytes(8, "little"))
    stream = grpc_service_pb2.ModelStreamInferResponse(infer_response=response)
    parsed = triton_svc.ModelStreamInferResponse.FromString(stream.SerializeToString())
    assert parsed.infer_response.outputs[0].parameters["binary_data_size"].int64_param == 8
    assert parsed.infer_response.raw_output_contents[0] == (5).to_bytes(8, "little")


@pytest.mark.parametrize("order", ["tritonclient-first", "inferd-first"])
def test_both_import_in_one_process(order: str) -> None:
    imports = [
        "import tritonclient.grpc\nfrom tritonclient.grpc import service_pb2 as T",
        "from inferd._proto import grpc_service_pb2 as O, grpc_service_pb2_grpc, _pool",
    ]
    if order == "inferd-first":
        imports.reverse()
    code = "\n".join(imports) + textwrap.dedent(
        """
        from google.protobuf import descriptor_pool
        default = descriptor_pool.Default()
        assert default.FindMessageTypeByName("inference.ModelInferRequest") is T.ModelInferRequest.DESCRIPTOR
        assert _pool.POOL.FindMessageTypeByName("inference.ModelInferRequest") is O.ModelInferRequest.DESCRIPTOR
        assert O.ModelInferRequest.DESCRIPTOR is not T.ModelInferRequest.DESCRIPTOR
        assert O.ModelInferRequest.__module__ == "inferd._proto.grpc_service_pb2"
        r = O.ModelInferRequest(model_name="m")
        r.inputs.add(name="x")
        assert type(r.inputs[0]) is O.ModelInferRequest.InferInputTensor
        assert T.ModelInferRequest.FromString(r.SerializeToString()).inputs[0].name == "x"
        print("ok")
        """
    )
    proc = _run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def _without_json_names(file_proto: Any) -> Any:
    """Drop json_name, which --descriptor_set_out fills in and Python gencode leaves out."""

    def clear(message_proto: Any) -> None:
        for f in message_proto.field:
            f.ClearField("json_name")
        for nested in message_proto.nested_type:
            clear(nested)

    for m in file_proto.message_type:
        clear(m)
    return file_proto


def test_generated_code_matches_proto_sources() -> None:
    """The committed *_pb2.py files embed exactly what protoc makes of proto/*.proto."""
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is not installed")
    from google.protobuf import descriptor_pb2

    from inferd._proto import grpc_service_pb2, model_config_pb2

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{REPO_ROOT / 'proto'}",
                f"--descriptor_set_out={out}",
                str(REPO_ROOT / "proto" / "model_config.proto"),
                str(REPO_ROOT / "proto" / "grpc_service.proto"),
            ]
        )
        assert rc == 0
        fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    fresh_by_name = {f.name: _without_json_names(f) for f in fresh.file}
    for module in (model_config_pb2, grpc_service_pb2):
        committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        assert committed == fresh_by_name[module.DESCRIPTOR.name], (
            f"{module.__name__} is stale: run `python -m inferd._proto.generate`"
        )
