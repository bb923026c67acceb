"""Triton's python_backend examples (``examples/`` of triton-inference-server/python_backend),
models and clients unmodified, against inferd: add_sub, bls (sync and async, with the pytorch
model they call), decoupled (repeat and square), bls_decoupled (sync and async) and
custom_metrics.

The files are read from a checkout or bare mirror of that repository
(``$TRITON_PYTHON_BACKEND_REPO``); the tests skip when it is not set. The repository is laid out
as the examples' READMEs say (``models/<name>/config.pbtxt``, ``models/<name>/1/model.py``).

The clients dial Triton's fixed ports (localhost:8000 HTTP, 8001 gRPC, 8002 metrics); the tests
pick free ports instead, so each client runs with a ``sitecustomize`` (``_PORT_SHIM``, on the
client's PYTHONPATH only) that points those three addresses at the test's server. The example
files themselves are copied byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import running

pytestmark = pytest.mark.server

SOURCE = Path(os.environ.get("TRITON_PYTHON_BACKEND_REPO", "python-backend-repo-not-set"))

# model name -> (model file, config file), under examples/, as the READMEs copy them.
MODELS = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
}
# (client script, what it prints when it passes)
CLIENTS = [
    ("add_sub/client.py", "PASS: add_sub"),
    ("bls/sync_client.py", "PASS: BLS Sync"),
    ("bls/async_client.py", "PASS: BLS Async"),
    ("decoupled/repeat_client.py", "PASS: repeat_int32"),
    ("decoupled/square_client.py", "PASS: square_int32"),
    ("bls_decoupled/sync_client.py", "PASS: BLS Decoupled Sync"),
    ("bls_decoupled/async_client.py", "PASS: BLS Decoupled Async"),
    ("custom_metrics/client.py", "PASS: custom_metrics"),
]

# Points Triton's default addresses at the test server's ports (INFERD_EXAMPLE_ADDRESSES: JSON
# {"localhost:8000": "127.0.0.1:P", ...}): tritonclient's two clients and requests.
_PORT_SHIM = '''
import json, os

_MAP = json.loads(os.environ["INFERD_EXAMPLE_ADDRESSES"])


def _moved(url):
    for old, new in _MAP.items():
        if old in url:
            return url.replace(old, new)
    return url


def _patch(cls):
    original = cls.__init__

    def __init__(self, url, *args, **kwargs):
        original(self, _moved(url), *args, **kwargs)

    cls.__init__ = __init__


import requests.sessions
import tritonclient.grpc
import tritonclient.http

_patch(tritonclient.grpc.InferenceServerClient)
_patch(tritonclient.http.InferenceServerClient)
_request = requests.sessions.Session.request
requests.sessions.Session.request = lambda self, method, url, *a, **k: _request(self, method, _moved(url), *a, **k)
'''


def _read(relative: str) -> bytes | None:
    """One file of the repository's examples/ folder, from a checkout or a bare mirror."""
    path = SOURCE / "examples" / relative
    if path.is_file():
        return path.read_bytes()
    if not (SOURCE / "HEAD").exists():
        return None
    proc = subprocess.run(["git", "--git-dir", str(SOURCE), "show", f"HEAD:examples/{relative}"],
                          capture_output=True, timeout=60)
    return proc.stdout if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("python_backend_examples")
    repo = root / "models"
    for name, (model, config) in MODELS.items():
        model_bytes, config_bytes = _read(model), _read(config)
        if model_bytes is None or config_bytes is None:
            pytest.skip(f"Triton's python_backend repository is not at {SOURCE} (set TRITON_PYTHON_BACKEND_REPO)")
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_bytes(model_bytes)
        (repo / name / "config.pbtxt").write_bytes(config_bytes)
    clients = root / "clients"
    for script, _ in CLIENTS:
        data = _read(script)
        assert data is not None, script
        (clients / Path(script).parent).mkdir(parents=True, exist_ok=True)
        (clients / script).write_bytes(data)
    shim = root / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_PORT_SHIM)
    done: dict[str, subprocess.CompletedProcess] = {}
    # Tracebacks are checked by test_server_logged_no_traceback, so one failing client does not hide the others.
    with running(repo, no_traceback=False) as server:
        metrics = server.metrics_url.removeprefix("http://").removesuffix("/metrics")
        addresses = {"localhost:8000": server.http_url, "localhost:8001": server.url, "localhost:8002": metrics}
        env = dict(os.environ, INFERD_EXAMPLE_ADDRESSES=json.dumps(addresses),
                   PYTHONPATH=os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]))
        for script, _ in CLIENTS:
            argv = [sys.executable, str(clients / script)]
            try:
                done[script] = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                              cwd=clients / Path(script).parent, env=env)
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
                done[script] = subprocess.CompletedProcess(argv, 124, out, f"timed out after {exc.timeout} s")
        done["server log"] = subprocess.CompletedProcess([], 0, server.log(), "")
    return done


@pytest.mark.parametrize("script,marker", CLIENTS, ids=[c[0] for c in CLIENTS])
def test_python_backend_example_passes(results, script, marker):
    proc = results[script]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output + "\n--- server log ---\n" + results["server log"].stdout[-4000:]
    assert marker in proc.stdout, output


def test_server_logged_only_the_models_own_errors(results):
    """The one traceback expected is bls_sync's: its client asks for a model that does not exist
    and the model raises; nothing else (no internal error) may log one."""
    record = ""
    for line in results["server log"].stdout.splitlines():
        if line[:4].isdigit() and " " in line:  # a log record's first line (its timestamp)
            record = line
        if line.startswith("Traceback"):
            assert "model 'bls_sync': execute raised" in record, results["server log"].stdout[-6000:]
