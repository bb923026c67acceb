"""The start-up table and ready sentence (inferd.repository.table), as plain data."""

from __future__ import annotations

from inferd.repository.table import ModelRow, format_table, readiness

ROWS = [
    ModelRow("add_sub", "-", "-", "-", "UNAVAILABLE", "model 'add_sub': config.pbtxt line 3: bad"),
    ModelRow("simple", "1, 2", "onnxruntime_onnx", "2 CPU", "READY", ""),
    ModelRow("later", "-", "-", "-", "NOT LOADED", ""),
]


def test_the_table_aligns_every_column_and_keeps_the_reason_whole() -> None:
    lines = format_table(ROWS).splitlines()
    assert lines[0].split() == ["MODEL", "VERSIONS", "BACKEND", "INSTANCES", "STATE", "REASON"]
    starts = {line.index(word) for line, word in zip(lines, ["MODEL", "add_sub", "simple", "later"])}
    assert starts == {0}
    state_col = lines[0].index("STATE")
    assert [line[state_col:].split()[0] for line in lines[1:]] == ["UNAVAILABLE", "READY", "NOT"]
    assert lines[1].endswith("model 'add_sub': config.pbtxt line 3: bad")
    assert lines[2].endswith("READY")  # no trailing spaces for an empty reason


def test_readiness_counts_the_models_asked_for_and_names_those_not_ready() -> None:
    assert readiness(ROWS, server_ready=False) == (
        "1 of 2 models ready; the server is not ready until every model is: add_sub is UNAVAILABLE")
    assert readiness(ROWS[1:], server_ready=True) == "1 of 1 models ready"


def test_no_rows_no_table() -> None:
    assert format_table([]) == "" and readiness([], server_ready=True) == "0 of 0 models ready"
