"""inferd.tune.aiperf: NVIDIA AIPerf as tune's load generator. The parser is tested on a file a
real ``aiperf profile`` run (0.13.0, against inferd serving mlp over KServe v2 HTTP) wrote; the
run itself, when aiperf is installed (on the PATH, or where $AIPERF points)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from inferd.tune.aiperf import (EXPORT, AIPerfRounds, command, find_aiperf, inputs_file, kserve_request,
                                parse_export, read_export, write_tokenizer)
from inferd.tune.run import Fleet, ServerSettings, TuneError

SAMPLE = Path(__file__).parent / "data" / EXPORT


def test_the_figures_are_read_from_a_recorded_export() -> None:
    doc = json.loads(SAMPLE.read_text())
    assert doc["aiperf_version"] == "0.13.0"
    figures = parse_export(doc)
    assert figures.throughput == pytest.approx(163.884530847584)
    assert figures.p50_us == pytest.approx(11991.456) and figures.p99_us == pytest.approx(40682.64772)
    assert figures.requests == 493 and figures.error_rate == 0.0
    assert figures.duration_s == pytest.approx(3.0, abs=0.01)  # the profiling phase only, not the warm-up


def test_a_broken_export_names_what_is_missing(tmp_path: Path) -> None:
    doc = json.loads(SAMPLE.read_text())
    del doc["request_latency"]["p99"]
    with pytest.raises(ValueError, match="request_latency.p99"):
        parse_export(doc)
    with pytest.raises(FileNotFoundError, match="aiperf wrote no profile_export_aiperf.json"):
        read_export(tmp_path)


def test_the_requests_are_kserve_v2_json_and_the_command_reaches_the_infer_endpoint(tmp_path: Path) -> None:
    step = {"INPUT0": np.arange(4, dtype=np.float32).reshape(1, 4), "TEXT": np.array([[b"hi"]], dtype=object)}
    body = kserve_request(step, {"INPUT0": "FP32", "TEXT": "BYTES"})
    assert body == {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]},
                               {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}]}
    assert inputs_file([body, body]) == {"data": [{"session_id": "request-0", "payloads": [body]},
                                                  {"session_id": "request-1", "payloads": [body]}]}
    tokenizer = write_tokenizer(tmp_path / "tok")
    assert json.loads((tokenizer / "tokenizer.json").read_text())["model"]["type"] == "WordLevel"
    argv = command("aiperf", "127.0.0.1:8000", "mlp", 4, 0.5, tmp_path / "in.json", tokenizer, tmp_path / "out")
    joined = " ".join(argv)
    assert "--url http://127.0.0.1:8000/v2/models/mlp/infer" in joined
    assert "--endpoint-type raw --custom-dataset-type inputs_json" in joined
    assert "--concurrency 4 --warmup-duration 0.5 --benchmark-duration 1.5" in joined


def test_without_aiperf_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIPERF", str(tmp_path / "no-such-aiperf"))
    assert find_aiperf() is None
    (tmp_path / "repo" / "m").mkdir(parents=True)
    fleet = Fleet(ServerSettings(tmp_path / "repo", "m"))
    try:
        with pytest.raises(TuneError, match="aiperf command is not installed .*pip install aiperf"):
            AIPerfRounds(fleet, None, tmp_path / "work")  # type: ignore[arg-type]
    finally:
        fleet.stop()


@pytest.mark.server
@pytest.mark.fixed_mode  # the fleet starts its own server
def test_a_round_with_aiperf_against_inferd(example_repository: Path, tmp_path: Path) -> None:
    if find_aiperf() is None:
        pytest.skip("aiperf is not installed (pip install aiperf, in a venv of its own if you like, and set "
                    "$AIPERF to its aiperf command)")
    from inferd.config import parse_config_file
    from inferd.tune.space import current

    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "mlp", repo / "mlp")
    base = parse_config_file(repo / "mlp" / "config.pbtxt", model="mlp")
    fleet = Fleet(ServerSettings(repo, "mlp", protocol="http", window_ms=500, levels=(2.0,)))
    rounds = AIPerfRounds(fleet, base, tmp_path / "work")
    try:
        r = rounds(current(base), 2.0)
    finally:
        rounds.close()
        fleet.stop()
    assert not r.error, r.error
    assert r.throughput > 0 and 0 < r.p50_us <= r.p99_us
    assert r.server_cpu_us is not None and r.server_cpu_us > 0 and r.client_cpu_s > 0
    figures = read_export(tmp_path / "work" / "round-0001")  # what the round was read from
    assert figures.throughput == r.throughput and figures.requests > 0
