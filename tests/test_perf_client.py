"""``inferd perf`` against a real server: counts, percentiles, CSV/JSON/PNG output, bad arguments."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import grpc
import numpy as np
import pytest

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd.cli import main
from inferd.perf.windows import ClientStats, Records, is_stable, percentile_index
from inferd.perf.report import csv_header

# The header perf_analyzer 2.60 writes with `-f` (checked against the real tool on this server),
# and with `-f --verbose-csv`.
PA_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
             "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
             "p50 latency,p90 latency,p95 latency,p99 latency")
PA_VERBOSE_HEADER = PA_HEADER + ",Avg latency,request/response,response wait"

FAST = ["-p", "200", "-r", "3", "-s", "1000", "-q"]


@pytest.fixture(scope="module")
def server(example_repository: Path):  # type: ignore[no-untyped-def]
    """One server for this module (its ModelStatistics are only touched by these tests)."""
    from conftest import ServerProcess

    proc = ServerProcess(example_repository)
    yield proc
    proc.stop()


def _success_count(url: str, model: str) -> int:
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=10)
    return sum(s.inference_stats.success.count for s in stats.model_stats)


def _perf(capsys, *args: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = main(["perf", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _run_ok(capsys, tmp_path: Path, *args: str) -> dict:  # type: ignore[no-untyped-def]
    out_json = tmp_path / "out.json"
    code, out, err = _perf(capsys, *args, "--json", str(out_json))
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(out_json.read_text())


def test_request_count_matches_server_statistics(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    before = _success_count(server.url, "mlp")
    result = _run_ok(capsys, tmp_path, "-m", "mlp", "-u", server.url, "--concurrency-range", "4",
                     "--request-count", "300", "--workers", "2", "-q")
    after = _success_count(server.url, "mlp")
    (level,) = result["levels"]
    assert level["requests"] == 300
    assert level["completed"] == 300 and level["errors"] == {}
    assert after - before == 300
    assert level["server"]["success_count"] == 300  # the tool's own delta agrees
    assert level["throughput_infer_per_s"] > 0
    assert result["client"]["cpu_s"] > 0 and result["client"]["workers"] == 2


def test_http_protocol_counts_match_server_statistics(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """-i http: the same load over KServe v2 REST (binary tensor data), BYTES inputs included,
    every request counted by the server; errors are counted under their status."""
    before = _success_count(server.url, "mlp")
    result = _run_ok(capsys, tmp_path, "-m", "mlp", "-u", server.http_url, "-i", "http", "--concurrency-range", "3",
                     "--request-count", "120", "--priority", "1", "-q")
    (level,) = result["levels"]
    assert level["completed"] == 120 and level["errors"] == {}
    assert _success_count(server.url, "mlp") - before == 120 == level["server"]["success_count"]
    strings = _run_ok(capsys, tmp_path, "-m", "simple_string", "-u", server.http_url, "-i", "http",
                      "--request-count", "20", "-q")
    assert strings["levels"][0]["completed"] == 20 and strings["levels"][0]["errors"] == {}
    # a 1 us queue timeout on a model that waits for a batch: refused with HTTP 503 -> UNAVAILABLE
    code, _, err = _perf(capsys, "-m", "mlp", "-u", server.http_url, "-i", "http", "--request-count", "5",
                         "--request-timeout-us", "1", "-q")
    if code == 1:  # every request refused: the tool says so with the server's message
        assert "all 5 requests failed" in err and "HTTP" in err


async def test_closed_loop_shares_a_grpc_channel_six_ways() -> None:
    """As tritonclient's C++ channel sharing (perf_analyzer's): 16 slots -> 3 connections."""
    from inferd.perf.transport import GrpcTransport

    transport = GrpcTransport("127.0.0.1:1")
    calls = [transport.caller(slot) for slot in range(16)]
    assert len(transport.channels) == 3
    assert calls[0] is calls[5] and calls[5] is not calls[6] and calls[12] is calls[15]
    await transport.close()


def test_percentiles_are_ordered(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _run_ok(capsys, tmp_path, "-m", "mlp", "-u", server.url, "--concurrency-range", "1:3:2",
                     "--request-count", "150", "-b", "4", "-q")
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 3]
    for lv in result["levels"]:
        lat = lv["latency_us"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert lv["server"]["inference_count"] == 4 * lv["server"]["success_count"] == 600
        assert lv["throughput_infer_per_s"] == pytest.approx(4 * lv["throughput_requests_per_s"])


def test_time_windows_and_open_loop(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _run_ok(capsys, tmp_path, "-m", "mlp", "-u", server.url, "--request-rate-range", "100",
                     "--request-distribution", "poisson", *FAST)
    (lv,) = result["levels"]
    assert lv["windows"] == 3
    # Stable or not is the machine's load; what the tool owes is perf_analyzer's rule applied to the windows
    # it measured (-s 1000: the last three within 11x of each other in throughput and mean latency).
    history = lv["window_history"]
    throughputs = [w["throughput"] for w in history]
    latencies = [w["avg_latency_us"] for w in history]
    rule = (all(w["count"] > 0 for w in history) and max(throughputs) <= 11 * min(throughputs)
            and max(latencies) <= 11 * min(latencies))
    assert lv["stable"] is rule, history
    assert lv["requests"] > 0 and lv["send_rate"] > 0
    assert lv["latency_us"]["p50"] <= lv["latency_us"]["p99"]


def test_csv_header_matches_perf_analyzer(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    plain, verbose = tmp_path / "plain.csv", tmp_path / "verbose.csv"
    code, _, err = _perf(capsys, "-m", "mlp", "-u", server.url, "--request-count", "50", "-q", "-f", str(plain))
    assert code == 0, err
    code, _, err = _perf(capsys, "-m", "mlp", "-u", server.url, "--request-count", "50", "-q",
                         "-f", str(verbose), "--verbose-csv")
    assert code == 0, err
    lines = plain.read_text().splitlines()
    assert lines[0] == PA_HEADER
    assert len(lines) == 2 and len(lines[1].split(",")) == len(PA_HEADER.split(","))
    row = dict(zip(PA_HEADER.split(","), lines[1].split(",")))
    assert row["Concurrency"] == "1" and float(row["Inferences/Second"]) > 0
    assert int(row["p50 latency"]) <= int(row["p99 latency"])
    vlines = verbose.read_text().splitlines()
    assert vlines[0] == PA_VERBOSE_HEADER
    assert len(vlines[1].split(",")) == len(PA_VERBOSE_HEADER.split(","))
    assert csv_header("request_rate", False)[0] == "Request Rate"


def test_plot_is_a_png(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    png = tmp_path / "out.png"
    code, _, err = _perf(capsys, "-m", "mlp", "-u", server.url, "--concurrency-range", "1:2",
                         "--request-count", "40", "-q", "--plot", str(png))
    assert code == 0, err
    data = png.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_variable_dims_with_shape_and_data_files(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = server.url
    before = _success_count(url, "identity_fp32")
    _run_ok(capsys, tmp_path, "-m", "identity_fp32", "-u", url, "--shape", "INPUT0:7", "-b", "2",
            "--request-count", "20", "-q", "--priority", "1", "--request-timeout-us", "5000000")
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": [1.0, 2.0, 3.0]},
                                         {"INPUT0": {"content": [1, 2, 3, 4], "shape": [4]}}]}))
    _run_ok(capsys, tmp_path, "-m", "identity_fp32", "-u", url, "--input-data", str(data),
            "--request-count", "20", "-q")
    npz = tmp_path / "data.npz"
    np.savez(npz, INPUT0=np.arange(5, dtype=np.float32))
    _run_ok(capsys, tmp_path, "-m", "identity_fp32", "-u", url, "--input-data", str(npz),
            "--request-count", "20", "-q", "--input-data", str(npz))
    _run_ok(capsys, tmp_path, "-m", "simple", "-u", url, "--input-data", "zero", "--request-count", "10", "-q")
    assert _success_count(url, "identity_fp32") - before == 60


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [
    (["--concurrency-range", "4:1"], "END 1 is below START 4"),
    (["--concurrency-range", "a:b"], "must be integers"),
    (["--concurrency-range", "1:2:3:4"], "expected START"),
    (["--concurrency-range", "0"], "START must be >= 1"),
    (["--request-rate-range", "0"], "START must be > 0"),
    (["--concurrency-range", "1", "--request-rate-range", "10"], "not allowed with"),
    (["--shape", "INPUT0"], "bad shape"),
    (["--shape", "INPUT0:a,2"], "bad shape"),
    (["--shape", "INPUT0:0"], "bad shape"),
    (["-b", "0"], "positive integer"),
])
def test_bad_arguments_exit_with_usage(args, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["perf", "-m", "mlp", "-u", "127.0.0.1:1", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("model, args, message", [
    ("no_such_model", [], "model 'no_such_model' is not available"),
    ("mlp", ["--shape", "NOPE:3"], "--shape names 'NOPE', not an input of model 'mlp'"),
    ("mlp", ["--shape", "INPUT0:3"], "the model's dims are [256]"),
    ("identity_fp32", [], "variable dims [-1]: give its shape with --shape INPUT0:N"),
    ("mlp", ["-b", "65"], "exceeds model 'mlp' max_batch_size 64"),
    ("add_sub", ["-b", "2"], "does not batch"),
    ("mlp", ["--input-data", "/nonexistent/data.json"], "no such file"),
])
def test_bad_model_arguments_give_a_clear_error(server, capsys, model, args, message) -> None:  # type: ignore[no-untyped-def]
    code, _, err = _perf(capsys, "-m", model, "-u", server.url, "--request-count", "1", *args)
    assert code == 1
    assert message in err and err.startswith("inferd perf: error:") and "Traceback" not in err


def test_unreachable_server(capsys) -> None:  # type: ignore[no-untyped-def]
    port = _closed_port()
    code, _, err = _perf(capsys, "-m", "mlp", "-u", f"127.0.0.1:{port}", "--connect-timeout", "2")
    assert code == 1
    assert f"cannot reach a gRPC inference server at 127.0.0.1:{port}" in err and "Traceback" not in err
    code, _, err = _perf(capsys, "-m", "mlp", "-u", f"127.0.0.1:{port}", "-i", "http", "--connect-timeout", "2")
    assert code == 1
    assert f"cannot reach an HTTP inference server at 127.0.0.1:{port}" in err and "Traceback" not in err


def test_data_that_does_not_fit_is_refused_before_sending(server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"INPUT0": [1, 2, 3], "INPUT1": list(range(16))}]}))
    code, _, err = _perf(capsys, "-m", "simple", "-u", server.url, "--input-data", str(bad),
                         "--request-count", "5", "-q")
    assert code == 1 and "3 values do not fill input 'INPUT0' of shape [1, 16]" in err
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"data": [{"INPUT0": list(range(16))}]}))
    code, _, err = _perf(capsys, "-m", "simple", "-u", server.url, "--input-data", str(missing), "-q")
    assert code == 1 and "has no data for input(s) INPUT1" in err


# --------------------------------------------------------------------------- measurement units


def test_percentiles_follow_perf_analyzer_rank() -> None:
    lat = np.arange(1, 101, dtype=np.int64) * 1000  # 1..100 us
    rec = Records(np.zeros(100, np.int64), lat, np.zeros(100, np.int32))
    stats = ClientStats.from_records(rec, 1_000_000_000)
    assert [stats.latency_us[f"p{p}"] for p in (50, 90, 95, 99)] == [51.0, 90.0, 95.0, 99.0]
    assert percentile_index(50, 100) == 50 and percentile_index(99, 1) == 0
    assert stats.throughput_rps == 100 and stats.latency_us["avg"] == 50.5


def test_errors_are_counted_by_code_and_excluded_from_latency() -> None:
    rec = Records(np.zeros(4, np.int64), np.array([10, 20, 30, 40]) * 1000,
                  np.array([0, 14, 0, 4], np.int32))
    stats = ClientStats.from_records(rec, 10**9)
    assert stats.success == 2 and stats.completed == 4
    assert stats.errors == {"UNAVAILABLE": 1, "DEADLINE_EXCEEDED": 1}
    assert stats.latency_us["avg"] == 20.0


def test_stability_rule() -> None:
    def window(thr: float, avg: float) -> ClientStats:
        return ClientStats(1.0, int(thr), int(thr), {}, thr, {"avg": avg})

    assert not is_stable([window(100, 10), window(100, 10)], 10)
    assert is_stable([window(50, 99), window(100, 10), window(105, 10.5), window(109, 10)], 10)
    assert not is_stable([window(100, 10), window(100, 10), window(120, 10)], 10)
    assert not is_stable([window(100, 10), window(100, 12), window(100, 10)], 10)


def test_closed_loop_defaults_to_a_worker_per_four_slots() -> None:
    """perf_analyzer drives each slot from its own thread; inferd perf gives each 4 slots their
    own process (one event loop for 16 slots was starved of CPU on a busy host and sent late)."""
    from inferd.perf.options import default_workers

    assert [default_workers("concurrency", [c]) for c in (1, 4, 5, 16, 64)] == [1, 1, 2, 4, 8]
    assert default_workers("concurrency", [1, 8, 16]) == 4  # the highest level of a sweep
    assert default_workers("request_rate", [1000.0]) == 1
