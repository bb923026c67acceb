"""Triton's own example clients (client repository, src/python/examples), unmodified, against
inferd serving Triton's example model repository (built in code:
inferd.examples.triton_examples).

The scripts are read from a checkout or bare mirror of triton-inference-server/client
(``TRITON_CLIENT_REPO``, default the shared mirror); the tests skip when there is none.
Not run: the CUDA shared memory clients (no CUDA here), ensemble_image_client.py (its
model is a DALI preprocessing ensemble) and memory_growth_test.py (a QA tool for a custom
C++ model, minutes long).
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import running
from inferd.examples import triton_examples

MIRROR = Path(os.environ.get("TRITON_CLIENT_REPO", "triton-client-repo-not-set"))  # a checkout of Triton's client repo
EXAMPLES = "src/python/examples"
IMAGE = "{image}"

# (script, arguments, which server, what the script prints when it passes; None: it prints
# nothing particular and exits non-zero on every failure)
GRPC_CLIENTS = [
    ("grpc_client.py", [], "grpc", "PASS"),
    ("grpc_explicit_byte_content_client.py", [], "grpc", "PASS: explicit string"),
    ("grpc_explicit_int8_content_client.py", [], "grpc", "PASS: explicit int8"),
    ("grpc_explicit_int_content_client.py", [], "grpc", "PASS: explicit int"),
    ("grpc_image_client.py", ["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", IMAGE], "grpc", "PASS"),
    ("image_client.py", ["-i", "grpc", "-m", "inception_onnx", "-c", "2", "-s", "INCEPTION", IMAGE], "grpc", "PASS"),
    ("reuse_infer_objects_client.py", ["-i", "grpc"], "grpc", None),
    ("simple_grpc_aio_infer_client.py", [], "grpc", "PASS: grpc aio infer"),
    ("simple_grpc_aio_sequence_stream_infer_client.py", [], "grpc", "PASS: grpc aio sequence stream"),
    ("simple_grpc_async_infer_client.py", [], "grpc", "PASS: Async infer"),
    ("simple_grpc_custom_args_client.py", [], "grpc", "PASS: CustomArgs"),
    ("simple_grpc_custom_repeat.py", [], "grpc", "PASS: Decoupled API"),
    ("simple_grpc_health_metadata.py", [], "grpc", None),
    ("simple_grpc_infer_client.py", [], "grpc", "PASS: infer"),
    ("simple_grpc_keepalive_client.py", [], "grpc", "PASS: KeepAlive"),
    ("simple_grpc_model_control.py", [], "control_grpc", "PASS: model control"),
    ("simple_grpc_sequence_stream_infer_client.py", [], "grpc", "PASS: Sequence"),
    ("simple_grpc_sequence_sync_infer_client.py", [], "grpc", "PASS: Sequence"),
    ("simple_grpc_shm_client.py", [], "grpc", "PASS: system shared memory"),
    ("simple_grpc_shm_string_client.py", [], "grpc", "PASS: system shared memory"),
    ("simple_grpc_string_infer_client.py", [], "grpc", "PASS: string"),
]
HTTP_CLIENTS = [
    ("image_client.py", ["-i", "http", "-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", IMAGE], "http", "PASS"),
    ("reuse_infer_objects_client.py", ["-i", "http"], "http", None),
    ("simple_http_aio_infer_client.py", [], "http", "PASS: infer"),
    ("simple_http_async_infer_client.py", [], "http", None),
    ("simple_http_health_metadata.py", [], "http", None),
    ("simple_http_infer_client.py", [], "http", None),
    ("simple_http_model_control.py", [], "control_http", "PASS: model control"),
    ("simple_http_sequence_sync_infer_client.py", [], "http", "PASS: Sequence"),
    ("simple_http_shm_client.py", [], "http", "PASS: system shared memory"),
    ("simple_http_shm_string_client.py", [], "http", "PASS: system shared memory"),
    ("simple_http_string_infer_client.py", [], "http", "PASS: string"),
]
CLIENTS = GRPC_CLIENTS + HTTP_CLIENTS


def _client_id(client: tuple) -> str:
    script, args, *_ = client
    protocol = next((a for a in args if a in ("grpc", "http")), "")
    return f"{script}{'[' + protocol + ']' if protocol else ''}"


def _scripts(target: Path) -> bool:
    """Copy the example scripts into ``target``; False when no source is there."""
    names = sorted({c[0] for c in CLIENTS})
    if (MIRROR / EXAMPLES).is_dir():  # a checkout
        for name in names:
            (target / name).write_bytes((MIRROR / EXAMPLES / name).read_bytes())
        return True
    if not (MIRROR / "HEAD").exists():  # neither a checkout nor a bare repository
        return False
    for name in names:
        proc = subprocess.run(["git", "--git-dir", str(MIRROR), "show", f"HEAD:{EXAMPLES}/{name}"],
                              capture_output=True, timeout=60)
        if proc.returncode != 0:
            return False
        (target / name).write_bytes(proc.stdout)
    return True


def _image(path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(7)
    Image.fromarray(rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8), "RGB").save(path)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    scripts = tmp_path_factory.mktemp("triton_examples")
    if not _scripts(scripts):
        pytest.skip(f"Triton's client repository is not at {MIRROR} (set TRITON_CLIENT_REPO)")
    image = scripts / "image.png"
    _image(image)
    repo = tmp_path_factory.mktemp("example_repository")
    triton_examples.build(repo, with_repeat=True)
    # The model-control clients count the models: 8 for the gRPC one, 7 for the older HTTP one
    # (written before simple_identity joined Triton's repository).
    control_repo = tmp_path_factory.mktemp("control_repository")
    triton_examples.build(control_repo)
    control_repo_7 = tmp_path_factory.mktemp("control_repository_7")
    triton_examples.build(control_repo_7, leave_out=["simple_identity"])
    explicit = ["--model-control-mode", "explicit"]
    # Triton's shared memory examples register regions: the server allows it, as Triton must be told.
    with running(repo, extra_args=["--allow-client-shm"]) as server, running(control_repo, extra_args=explicit) as control, \
            running(control_repo_7, extra_args=explicit) as control_7:
        urls = {"grpc": server.url, "http": server.http_url, "control_grpc": control.url,
                "control_http": control_7.http_url}

        def run(client: tuple) -> tuple[str, subprocess.CompletedProcess]:
            script, args, where, _ = client
            argv = [sys.executable, str(scripts / script), "-u", urls[where],
                    *[str(image) if a == IMAGE else a for a in args]]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=scripts)
            except subprocess.TimeoutExpired as exc:  # that client fails; the others still run
                out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
                proc = subprocess.CompletedProcess(argv, 124, out, f"timed out after {exc.timeout} s")
            return _client_id(client), proc

        # One after the other: the model-control clients change what the control server has loaded,
        # the shared-memory ones use the same region names and keys, and the sequence ones the same
        # sequence ids (1000, 1001) on the same model.
        alone = [c for c in CLIENTS if c[2].startswith("control") or "_shm_" in c[0] or "sequence" in c[0]]
        with ThreadPoolExecutor(4) as pool:
            done = dict(pool.map(run, [c for c in CLIENTS if c not in alone]))
        done.update(run(c) for c in alone)
    return done


# Clients that still fail, with why (strict: one that starts passing must leave this list).
PENDING = {
}


def _params():  # type: ignore[no-untyped-def]
    for c in CLIENTS:
        reason = PENDING.get(_client_id(c))
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        yield pytest.param(c, id=_client_id(c), marks=marks)


@pytest.mark.parametrize("client", list(_params()))
def test_triton_example_client_passes(results, client):
    script, _, _, marker = client
    proc = results[_client_id(client)]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "context creation failed" not in output, output
    if marker is not None:
        assert marker in proc.stdout, output
