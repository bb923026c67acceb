"""Start-up as a user sees it: a missing repository is one line and status 2 before any
port opens; loading ends with one sorted table of the models and a line saying whether
the server is ready and why not; an empty repository is warned about;
``--strict-model-config`` refuses a model that does not bring its config."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from repo_builder import add_model, config

from inferd.examples import onnx_models as om

SERVE = [sys.executable, "-m", "inferd.cli", "serve", "--grpc-address", "127.0.0.1", "--http-address", "127.0.0.1",
         "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"]


def _report(server) -> list[str]:  # type: ignore[no-untyped-def]
    """The log from the table's header to the ready line (printed just after the port file)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = server.log().splitlines()
        if any(line.startswith("inferd: ") and " models ready" in line for line in lines):
            start = next((i for i, line in enumerate(lines) if line.startswith("MODEL ")), None)
            end = next(i for i, line in enumerate(lines) if line.startswith("inferd: ") and " models ready" in line)
            return lines[start if start is not None else end:end + 1]
        time.sleep(0.05)
    raise AssertionError(f"no ready line:\n{server.log()}")


def _identity(repo: Path, name: str, with_config: bool = True, text: str | None = None) -> None:
    body = text if text is not None else config(name, [("INPUT0", "TYPE_FP32", [4])],
                                                [("OUTPUT0", "TYPE_FP32", [4])], 0)
    add_model(repo, name, om.identity(np.float32, [4], batch=False), body if with_config else None)


def test_a_missing_repository_is_one_line_and_status_2_before_any_port_opens(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    proc = subprocess.run([*SERVE, "--model-repository", str(missing)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"inferd: model repository '{missing}' does not exist\n"


def test_a_file_given_as_repository_is_refused_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = subprocess.run([*SERVE, "--model-repository", str(tmp_path / "file")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("is not a directory"), proc.stderr


def test_loading_ends_with_a_sorted_table_and_a_not_ready_line_naming_the_broken_model(start_server,
                                                                                       tmp_path: Path) -> None:
    _identity(tmp_path, "zeta")
    _identity(tmp_path, "alpha")
    _identity(tmp_path, "broken", text="max_batch_sise: 0\n")
    report = _report(start_server(tmp_path))
    # MEMORY: each loaded model's measured footprint (every control mode measures it)
    assert report[0].split() == ["MODEL", "VERSIONS", "BACKEND", "INSTANCES", "MEMORY", "STATE", "REASON"]
    rows = report[1:-1]
    assert [r.split()[0] for r in rows] == ["alpha", "broken", "zeta"]
    assert re.fullmatch(r"alpha +1 +onnxruntime_onnx +1 CPU +[\d.]+ [KMG]iB +READY *", rows[0]), rows[0]
    assert re.match(r"broken +- +- +- +- +UNAVAILABLE +.*did you mean 'max_batch_size'\?", rows[1]), rows[1]
    assert report[-1].startswith("inferd: NOT ready, 2 of 3 models ready; the server is not ready until every "
                                 "model is: broken is UNAVAILABLE; serving gRPC on 127.0.0.1:")


def test_all_ready_says_ready(start_server, tmp_path: Path) -> None:
    _identity(tmp_path, "only")
    assert _report(start_server(tmp_path))[-1].startswith("inferd: ready, 1 of 1 models ready; serving gRPC on")


def test_an_empty_repository_is_warned_about(start_server, tmp_path: Path) -> None:
    server = start_server(tmp_path)
    assert _report(server)[-1].startswith("inferd: ready, 0 of 0 models ready")
    assert f"WARNING inferd: model repository '{tmp_path}' holds no model folder" in server.log()


def test_strict_model_config_refuses_a_model_without_its_config(start_server, tmp_path: Path) -> None:
    _identity(tmp_path, "complete")
    _identity(tmp_path, "bare", with_config=False)
    _identity(tmp_path, "partial", text='name: "partial"\nplatform: "onnxruntime_onnx"\n')
    rows = {line.split()[0]: line for line in _report(start_server(tmp_path, ["--strict-model-config=true"]))[1:-1]}
    assert " READY" in rows["complete"]
    assert "no config.pbtxt" in rows["bare"] and "--strict-model-config=true" in rows["bare"]
    assert "UNAVAILABLE" in rows["partial"] and "lists no input" in rows["partial"]


def test_without_strict_model_config_both_are_completed_from_the_model_file(start_server, tmp_path: Path) -> None:
    _identity(tmp_path, "bare", with_config=False)
    _identity(tmp_path, "partial", text='name: "partial"\nplatform: "onnxruntime_onnx"\n')
    report = _report(start_server(tmp_path, ["--strict-model-config=false"]))
    assert report[-1].startswith("inferd: ready, 2 of 2 models ready")


def test_an_unknown_load_model_exits_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    _identity(tmp_path, "only")
    proc = subprocess.run([*SERVE, "--model-repository", str(tmp_path), "--model-control-mode", "explicit",
                           "--load-model", "onyl"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("inferd: "), proc.stderr
