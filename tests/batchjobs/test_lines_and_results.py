"""Batch input parsing and the result writers (JSONL, Parquet, NPZ)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from inferd.batchjobs import JsonlResults, ParquetResults, Result, npz_bytes, parse_lines, read_jsonl, to_request
from inferd.errors import InvalidArgument


def line(custom_id, value=1.0) -> str:  # type: ignore[no-untyped-def]
    return json.dumps({"custom_id": custom_id,
                       "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})


def test_lines_keep_their_number_and_lose_the_custom_id():
    data = "\n".join([line("a"), "", line("b", 2.0)]) + "\n"
    lines = parse_lines(data.encode())
    assert [(l.number, l.custom_id) for l in lines] == [(1, "a"), (3, "b")]
    assert "custom_id" not in lines[1].body and lines[1].body["inputs"][0]["data"] == [2.0]


@pytest.mark.parametrize("text, words", [
    ("{not json", ["line 1", "not valid JSON"]),
    ("[1, 2]", ["line 1", "must be a JSON object", "list"]),
    ('{"inputs": [{}]}', ["line 1", "'custom_id' must be a non-empty string", "None"]),
    (line("a") + "\n" + line("a"), ["line 2", "custom_id 'a' is already used on line 1"]),
    ('{"custom_id": "x", "inputs": []}', ["line 1", "custom_id 'x'", "'inputs' must be a non-empty list"]),
    ("\n\n", ["no requests"]),
])
def test_bad_input_is_refused_naming_the_line(text, words):
    with pytest.raises(InvalidArgument) as exc:
        parse_lines(text)
    for word in words:
        assert word in exc.value.message


def sample_results() -> list[Result]:
    text = np.empty((2, 1), dtype=np.object_)
    text[:, 0] = [b"\xaa\x00", b"ok"]
    return [
        Result("a", outputs={"OUT": np.arange(6, dtype=np.float32).reshape(2, 3), "TEXT": text}, model_version="1"),
        Result("b", error="model 'm': bad input", error_type="InvalidArgument"),
    ]


def test_jsonl_results_round_trip_every_tensor_exactly(tmp_path):
    path = tmp_path / "results.jsonl"
    writer = JsonlResults(path)
    for r in sample_results():
        writer.write(r)
    writer.write(Result("a", error="a second result for a"))  # ignored: one result per custom id
    writer.close()
    got = list(read_jsonl(path))
    assert [r.custom_id for r in got] == ["a", "b"]
    assert got[0].model_version == "1"
    np.testing.assert_array_equal(got[0].outputs["OUT"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert got[0].outputs["OUT"].dtype == np.float32
    assert got[0].outputs["TEXT"].tolist() == [[b"\xaa\x00"], [b"ok"]]  # not UTF-8: base64 in the file
    assert got[1].error == "model 'm': bad input" and got[1].error_type == "InvalidArgument"


def test_a_line_cut_short_by_a_crash_is_dropped_on_reopen(tmp_path):
    path = tmp_path / "results.jsonl"
    writer = JsonlResults(path)
    writer.write(sample_results()[0])
    writer.close()
    with open(path, "ab") as f:
        f.write(b'{"custom_id": "b", "outp')  # the process died mid-write
    writer = JsonlResults(path)
    assert writer.done() == {"a"}
    writer.write(sample_results()[1])
    writer.close()
    assert [r.custom_id for r in read_jsonl(path)] == ["a", "b"]


def test_npz_holds_each_output_and_the_errors(tmp_path):
    with np.load(io.BytesIO(npz_bytes(iter(sample_results()))), allow_pickle=True) as npz:
        assert sorted(npz.files) == ["__errors__", "a/OUT", "a/TEXT"]
        np.testing.assert_array_equal(npz["a/OUT"], np.arange(6, dtype=np.float32).reshape(2, 3))
        assert json.loads(str(npz["__errors__"])) == {"b": "model 'm': bad input"}


def test_parquet_results_one_part_per_sync_and_resumable(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "out"
    writer = ParquetResults(folder)
    writer.write(sample_results()[0])
    writer.sync()
    writer.write(sample_results()[1])
    writer.close()
    (folder / "part-000009.parquet.tmp").write_bytes(b"half")  # a crash mid-part
    again = ParquetResults(folder)
    assert again.done() == {"a", "b"} and not list(folder.glob("*.tmp"))
    first = pq.read_table(folder / "part-000001.parquet").to_pylist()[0]
    assert first["custom_id"] == "a" and first["error"] is None
    assert first["OUT"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and first["OUT__shape"] == [2, 3]
    second = pq.read_table(folder / "part-000002.parquet").to_pylist()[0]
    assert second["custom_id"] == "b" and second["error"] == "model 'm': bad input"


def test_a_line_becomes_a_background_request():
    doc = {"custom_id": "c1", "parameters": {"max_tokens": 3}, "outputs": [{"name": "TEXT"}], "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [[1.5, 2.5]]},
        {"name": "P", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}
    request = to_request("gen", 2, parse_lines(json.dumps(doc))[0])
    assert request.background and request.model_name == "gen" and request.model_version == 2
    assert request.id == "c1" and request.parameters == {"max_tokens": 3}
    assert [r.name for r in request.requested_outputs] == ["TEXT"]
    np.testing.assert_array_equal(request.inputs["X"], np.array([[1.5, 2.5]], np.float32))
    assert request.inputs["P"].tolist() == [[b"hi"]]


@pytest.mark.parametrize("tensor, words", [
    ({"name": "X", "datatype": "FP99", "shape": [1], "data": [1]}, ["input 'X'", "unknown datatype 'FP99'"]),
    ({"name": "X", "datatype": "FP32", "shape": [1, 3], "data": [1, 2]}, ["input 'X'", "shape [1, 3]"]),
    ({"name": "X", "datatype": "FP32", "shape": "1", "data": [1]}, ["'shape' must be a list"]),
    ({"name": "X", "datatype": "FP32", "shape": [1]}, ["'data' is missing"]),
])
def test_a_bad_tensor_names_its_line_and_input(tensor, words):
    line = parse_lines(json.dumps({"custom_id": "c9", "inputs": [tensor]}))[0]
    with pytest.raises(InvalidArgument) as exc:
        to_request("m", 0, line)
    assert "custom_id 'c9' (line 1)" in exc.value.message
    for word in words:
        assert word in exc.value.message
