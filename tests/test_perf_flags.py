"""``inferd perf``'s perf_analyzer flags against a real server: streaming, sequences, shared
memory, headers, TLS, request intervals, and the errors for flags that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd.cli import main
from inferd.perf import parse_options
from inferd.perf.runner import interval_schedules


def _perf(capsys, *args: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = main(["perf", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _level(capsys, tmp_path: Path, *args: str) -> dict:  # type: ignore[no-untyped-def]
    out_json = tmp_path / "out.json"
    code, _, err = _perf(capsys, *args, "-q", "--json", str(out_json))
    assert code == 0, err
    (level,) = json.loads(out_json.read_text())["levels"]
    return level


def _system_regions(url: str) -> dict:
    with grpc.insecure_channel(url) as channel:
        status = pb_grpc.GRPCInferenceServiceStub(channel).SystemSharedMemoryStatus(
            pb.SystemSharedMemoryStatusRequest(), timeout=10)
    return dict(status.regions)


@pytest.mark.parametrize("extra", [[], ["--streaming"], ["-i", "http"]], ids=["grpc", "streaming", "http"])
def test_a_sequence_model_gets_sequence_ids_and_every_request_succeeds(example_server, capsys, tmp_path,
                                                                       extra) -> None:  # type: ignore[no-untyped-def]
    """simple_sequence refuses a request without a correlation id (INVALID_ARGUMENT), so 60
    successes counted by the server say each request carried its sequence's id and flags."""
    url = example_server.http_url if "http" in extra else example_server.url
    level = _level(capsys, tmp_path, "-m", "simple_sequence", "-u", url, "--concurrency-range", "3",
                   "--request-count", "60", "--sequence-length", "4", "--sequence-id-range", "100:200", *extra)
    assert level["completed"] == 60 and level["errors"] == {}, level["error_messages"]
    assert level["server"]["success_count"] == 60


def test_streaming_open_loop_with_headers(example_server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    level = _level(capsys, tmp_path, "-m", "mlp", "-u", example_server.url, "--streaming", "-H", "x-token: s3cret",
                   "--request-rate-range", "200", "--request-count", "50")
    assert level["completed"] == 50 and level["errors"] == {} and level["server"]["success_count"] == 50
    written = (tmp_path / "out.json").read_text()
    assert "x-token" in written and "s3cret" not in written  # a header's value may be a credential


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_system_shared_memory_carries_the_tensors_and_is_removed_after(example_server, capsys, tmp_path,
                                                                       protocol) -> None:  # type: ignore[no-untyped-def]
    url = example_server.http_url if protocol == "http" else example_server.url
    level = _level(capsys, tmp_path, "-m", "simple", "-u", url, "-i", protocol, "--shared-memory", "system",
                   "--output-shared-memory-size", "64", "--request-count", "30", "--concurrency-range", "2")
    assert level["completed"] == 30 and level["errors"] == {}, level["error_messages"]
    assert _system_regions(example_server.url) == {}
    assert not list(Path("/dev/shm").glob("inferd_perf_*"))


def test_an_output_region_too_small_is_the_servers_error(example_server, capsys) -> None:  # type: ignore[no-untyped-def]
    """simple's outputs are 64 bytes each: an 8-byte region fails every request, and the tool
    says so with the server's message (not a silent success)."""
    code, _, err = _perf(capsys, "-m", "simple", "-u", example_server.url, "--shared-memory", "system",
                         "--output-shared-memory-size", "8", "--request-count", "3", "-q")
    assert code == 1 and "all 3 requests failed" in err and "OUTPUT0" in err, err
    assert _system_regions(example_server.url) == {}


def test_request_intervals_schedule(example_server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    intervals = tmp_path / "intervals.txt"
    intervals.write_text("2000\n\n8000\n")
    options = parse_options(["-m", "mlp", "--request-intervals", str(intervals)])
    assert options.mode == "request_rate" and options.levels == [200.0] and options.intervals_us == [2000, 8000]
    # two workers: sends 0, 2, 4... to the first, 1, 3, 5... to the second, in time order
    assert interval_schedules([2000, 8000], 2) == [(0.0, [10_000_000.0, 10_000_000.0]),
                                                   (0.002, [10_000_000.0, 10_000_000.0])]
    assert interval_schedules([1000, 2000, 3000], 2)[1] == (0.001, [5_000_000.0, 3_000_000.0, 4_000_000.0])
    csv = tmp_path / "out.csv"
    code, _, err = _perf(capsys, "-m", "mlp", "-u", example_server.url, "--request-intervals", str(intervals),
                         "--request-count", "12", "-q", "-f", str(csv))
    assert code == 0, err
    header, row = csv.read_text().splitlines()
    assert header.startswith("Request Rate,") and row.startswith("200,")


@pytest.mark.parametrize("args, message", [
    (["--streaming", "-i", "http"], "--streaming is gRPC only"),
    (["--ssl-https-verify-peer", "0"], "--ssl-https-verify-peer: HTTPS options, but -i is grpc"),
    (["-i", "http", "--ssl-grpc-use-ssl"], "--ssl-grpc-use-ssl: gRPC options, but -i is http"),
    (["--ssl-grpc-root-certifications-file", "/nonexistent.pem"], "TLS root certificates file '/nonexistent.pem'"),
    (["--ssl-grpc-private-key-file", __file__], "mutual TLS needs both"),
])
def test_flags_that_do_not_fit_are_refused(args, message, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = _perf(capsys, "-m", "mlp", "-u", "127.0.0.1:1", *args)
    assert code == 1 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("args, message", [
    (["-H", "no-colon"], "expected NAME:VALUE"),
    (["-H", "content-type: x"], "set by the transport itself"),
    (["--sequence-id-range", "5:5"], "must be above START"),
    (["--shared-memory", "disk"], "invalid choice"),
])
def test_bad_flag_syntax_exits_with_usage(args, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["perf", "-m", "mlp", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_bad_intervals_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.txt"
    bad.write_text("100\nsoon\n")
    code, _, err = _perf(capsys, "-m", "mlp", "-u", "127.0.0.1:1", "--request-intervals", str(bad))
    assert code == 1 and "line 2: 'soon' is not an integer" in err


def test_help_says_what_each_protocol_supports(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["perf", "--help"])
    out = capsys.readouterr().out
    assert "what each protocol (-i) supports" in out and "all but --streaming" in out


# -- TLS ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtls_server(example_repository: Path, tmp_path_factory):  # type: ignore[no-untyped-def]
    from certs import make_certs
    from conftest import running

    certs = make_certs(tmp_path_factory.mktemp("certs"))
    args = ["--grpc-use-ssl-mutual", "true", "--grpc-server-cert", str(certs.server_cert),
            "--grpc-server-key", str(certs.server_key), "--grpc-root-cert", str(certs.ca),
            "--http-use-ssl-mutual", "true", "--http-server-cert", str(certs.server_cert),
            "--http-server-key", str(certs.server_key), "--http-root-cert", str(certs.ca)]
    with running(example_repository, extra_args=args) as server:
        yield server, certs


def test_mutual_tls_over_grpc_and_https(mtls_server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server, certs = mtls_server
    host = server.url.replace("127.0.0.1", "localhost")
    level = _level(capsys, tmp_path, "-m", "mlp", "-u", host, "--request-count", "20", "--ssl-grpc-use-ssl",
                   "--ssl-grpc-root-certifications-file", str(certs.ca),
                   "--ssl-grpc-private-key-file", str(certs.client_key),
                   "--ssl-grpc-certificate-chain-file", str(certs.client_cert))
    assert level["completed"] == 20 and level["errors"] == {}
    level = _level(capsys, tmp_path, "-m", "mlp", "-u", server.http_url, "-i", "http", "--request-count", "20",
                   "--ssl-https-ca-certificates-file", str(certs.ca),
                   "--ssl-https-client-certificate-file", str(certs.client_cert),
                   "--ssl-https-private-key-file", str(certs.client_key))
    assert level["completed"] == 20 and level["errors"] == {}
    # without a client certificate the server refuses the handshake: a clear error, no traceback
    code, _, err = _perf(capsys, "-m", "mlp", "-u", server.http_url, "-i", "http", "--request-count", "2",
                         "--ssl-https-ca-certificates-file", str(certs.ca), "--connect-timeout", "5", "-q")
    assert code == 1 and "Traceback" not in err


def test_streaming_a_decoupled_model_counts_each_request_once(example_server, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """repeat_decoupled answers each request with REPEAT=3 responses on the stream: the later
    ones must not settle other requests (30 requests, 30 completions, no errors)."""
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"IN": [5], "REPEAT": [3]}]}))
    level = _level(capsys, tmp_path, "-m", "repeat_decoupled", "-u", example_server.url, "--streaming",
                   "--concurrency-range", "2", "--request-count", "30", "--input-data", str(data))
    assert level["completed"] == 30 and level["errors"] == {} and level["server"]["success_count"] == 30
