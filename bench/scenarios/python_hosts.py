"""Python models in model hosts against Triton's stub processes (issue 48).

    One repository of Triton Python models, served by inferd's default mode (Python models in model
    hosts) and by Triton 2.51 (tritonserver with its python backend: each instance in a stub process),
    both up for the whole run on the same cores, perf_analyzer over gRPC, rounds alternating between
    the servers:

    - ``busy`` does ~3 ms of pure-Python work per request; ``busy1`` has one instance, ``busy2`` two:
      throughput at 4 requests in flight (two instances should double it: each has a process);
    - ``trivial`` answers its input: its p50/p99 alone at concurrency 1, then again while a closed loop
      of 4 clients keeps ``busy2`` saturated (a busy Python model must not stall the others);
    - inferd only: ``trivial_inline`` (the same model with ``inferd.host: inline``, in the core) against
      ``trivial`` hosted, at concurrency 1 (p50) and 16 (throughput): the price of the hop.

    CPU per inference of each server's process tree (core, frontend workers, hosts; Triton and its stubs)
    from /proc, beside each figure. Triton is found through TRITON_PEER_HOME: a folder holding pytriton-venv/
    (the nvidia-pytriton wheel's tritonserver 2.51 and its Python) and triton_backends/ (its python backend),
    as the peers' set-up script builds them (default $PEERS_HOME, then ~/.cache/inferd-peers); without it
    only inferd's figures are measured."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

NEEDS_PERF_ANALYZER = True
INFERD, TRITON = "inferd (default mode)", "Triton 2.51"
BUSY_LOOP = 60_000  # iterations of the busy model's Python loop: ~3 ms on the 2-core hosts here

_TRIVIAL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''

_BUSY = '''
import triton_python_backend_utils as pb_utils

LOOP = {loop}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            total = 0
            for i in range(LOOP):  # pure Python: holds the GIL throughout
                total += i * i
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]))
        return out
'''

_CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}'''


def build_repository(root: Path) -> Path:
    """The scenario's models, in Triton's layout (Triton reads it as it is: inferd. parameters it ignores)."""
    repo = root / "python_hosts"
    shutil.rmtree(repo, ignore_errors=True)
    models = {
        "trivial": (_TRIVIAL, 1, ""),
        "trivial_inline": (_TRIVIAL, 1, 'parameters { key: "inferd.host" value: { string_value: "inline" } }'),
        "busy1": (_BUSY.format(loop=BUSY_LOOP), 1, ""),
        "busy2": (_BUSY.format(loop=BUSY_LOOP), 2, ""),
    }
    for name, (source, count, extra) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(_CONFIG.format(name=name, count=count, extra=extra))
    return repo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_home() -> Path | None:
    for candidate in (os.environ.get("TRITON_PEER_HOME"), os.environ.get("PEERS_HOME"),
                      str(Path.home() / ".cache" / "inferd-peers")):
        if candidate and (Path(candidate) / "pytriton-venv").is_dir() and (Path(candidate) / "triton_backends").is_dir():
            return Path(candidate)
    return None


class Triton:
    """tritonserver from the peers' pytriton venv, with its python backend, on ``repo`` (its own session)."""

    def __init__(self, home: Path, repo: Path, work: Path) -> None:
        venv = home / "pytriton-venv"
        python = venv / "bin" / "python"
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
        libdir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
        self.grpc, http, metrics = _free_port(), _free_port(), _free_port()
        self.url = f"127.0.0.1:{self.grpc}"
        work.mkdir(parents=True, exist_ok=True)
        self.log_path = work / "triton.log"
        env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
                   LD_LIBRARY_PATH=f"{libdir}:{site}/nvidia_pytriton.libs", PYTHONPATH=site)
        # From a folder of its own: the stub puts its working directory on sys.path, and a checkout's own
        # triton_python_backend_utils/ would shadow Triton's.
        self.proc = subprocess.Popen(
            [f"{site}/pytriton/tritonserver/bin/tritonserver", f"--model-repository={repo}",
             f"--backend-directory={home / 'triton_backends'}", f"--cache-directory={site}/pytriton/tritonserver/caches",
             "--http-address=127.0.0.1", f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc}",
             "--metrics-address=127.0.0.1", f"--metrics-port={metrics}", "--allow-gpu-metrics=false",
             "--backend-config=python,shm-default-byte-size=4194304", "--exit-on-error=true"],
            cwd=work, env=env, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        import tritonclient.grpc as grpcclient

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                with grpcclient.InferenceServerClient(self.url) as c:
                    if c.is_server_ready():
                        return
            except Exception:  # noqa: BLE001  (not up yet)
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tritonserver not ready in 180 s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


class Saturate:
    """A closed loop of ``clients`` tritonclient threads on ``model`` until stopped (the background load)."""

    def __init__(self, url: str, model: str, clients: int = 4) -> None:
        self._stop = threading.Event()
        self.done = 0
        self._threads = [threading.Thread(target=self._loop, args=(url, model), daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _loop(self, url: str, model: str) -> None:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(url) as c:
            data = grpcclient.InferInput("INPUT0", [4], "FP32")
            data.set_data_from_numpy(np.ones(4, np.float32))
            while not self._stop.is_set():
                c.infer(model, [data])
                self.done += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def _measure(label: str, root: int, url: str, model: str, c: int, quick: bool) -> dict:
    from bench.bench import run_pa
    from bench.proc_cpu import CpuMeter, statistics_count

    meter = CpuMeter(root, statistics_count(url))
    before = meter.sample()
    m = run_pa(label, model, url, c, shape=None, window_ms=2000 if quick else 3000, stability=40,
               trials=6 if quick else 8)
    cpu = meter.since(before)
    m.note = (m.note + "; " if m.note else "") + f"{model}; CPU/inference {cpu.per_inference_us():.0f} us"
    out = asdict(m)
    out.update(model=model, server=label.split(":")[0], cpu_us=cpu.per_inference_us())
    return out


def _round(server: str, root: int, url: str, quick: bool) -> list[dict]:
    rows = [_measure(f"{server}: busy1 (1 instance)", root, url, "busy1", 4, quick),
            _measure(f"{server}: busy2 (2 instances)", root, url, "busy2", 4, quick),
            _measure(f"{server}: trivial alone", root, url, "trivial", 1, quick)]
    load = Saturate(url, "busy2")
    try:
        rows.append(_measure(f"{server}: trivial beside busy2 saturated", root, url, "trivial", 1, quick))
    finally:
        load.stop()
    return rows


def _hop_round(root: int, url: str, quick: bool) -> list[dict]:
    return [_measure(f"{INFERD}: trivial hosted", root, url, "trivial", 1, quick),
            _measure(f"{INFERD}: trivial inline", root, url, "trivial_inline", 1, quick),
            _measure(f"{INFERD}: trivial hosted", root, url, "trivial", 16, quick),
            _measure(f"{INFERD}: trivial inline", root, url, "trivial_inline", 16, quick)]


def run(quick: bool) -> dict:
    from bench.bench import OUT, Proc, free_port

    repo = build_repository(OUT / "tmp")
    port = free_port()
    inferd = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                   "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                   "--http-port", "0", "--metrics-port", "0"], "inferd: ready", "inferd-python-hosts")
    servers: list[tuple[str, int, str]] = [(INFERD, inferd.proc.pid, f"127.0.0.1:{port}")]
    home = peer_home()
    triton = None
    notes = []
    if home is None:
        notes.append("Triton was not measured: no tritonserver found (set TRITON_PEER_HOME).")
    else:
        triton = Triton(home, repo, OUT / "tmp" / "triton")
        servers.append((TRITON, triton.proc.pid, triton.url))
    measures: list[dict] = []
    try:
        for _ in range(2 if quick else 3):
            for server, root, url in servers:
                measures += _round(server, root, url, quick)
            measures += _hop_round(servers[0][1], servers[0][2], quick)
    finally:
        inferd.stop()
        if triton is not None:
            triton.stop()
    return {"measures": measures, "notes": "\n".join(notes), "busy_loop": BUSY_LOOP}


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else 0.0


def ratios(result: dict) -> dict:
    rows = result["measures"]

    def pick(label: str, c: int, field: str) -> list[float]:
        return [m[field] for m in rows if m["label"] == label and m["concurrency"] == c and m[field] > 0]

    out: dict[str, Any] = {}
    for server in (INFERD, TRITON):
        one = pick(f"{server}: busy1 (1 instance)", 4, "infer_per_s")
        two = pick(f"{server}: busy2 (2 instances)", 4, "infer_per_s")
        if one and two:
            shares = [b / a for a, b in zip(one, two)]
            out[f"{server}: 2 instances / 1 instance at 4 in flight (target >= 1.5x; Triton 1.95x in the issue)"] = (
                f"{_median(shares):.2f}x (rounds {', '.join(f'{s:.2f}' for s in shares)}; "
                f"{_median(two):,.0f} vs {_median(one):,.0f}/s)")
        alone = pick(f"{server}: trivial alone", 1, "p50_us")
        beside = pick(f"{server}: trivial beside busy2 saturated", 1, "p50_us")
        if alone and beside:
            shares = [b / a for a, b in zip(alone, beside)]
            p99a = _median(pick(f"{server}: trivial alone", 1, "p99_us"))
            p99b = _median(pick(f"{server}: trivial beside busy2 saturated", 1, "p99_us"))
            out[f"{server}: trivial p50 beside a saturated model / alone (target <= 1.5x)"] = (
                f"{_median(shares):.2f}x (p50 {_median(beside):,.0f} vs {_median(alone):,.0f} us; "
                f"p99 {p99b:,.0f} vs {p99a:,.0f} us)")
    hosted1, inline1 = pick(f"{INFERD}: trivial hosted", 1, "p50_us"), pick(f"{INFERD}: trivial inline", 1, "p50_us")
    if hosted1 and inline1:
        diffs = [h - i for h, i in zip(hosted1, inline1)]
        out["inferd: trivial hosted p50 - inline p50 at c=1 (target <= +100 us)"] = (
            f"{_median(diffs):+.0f} us (rounds {', '.join(f'{d:+.0f}' for d in diffs)})")
    hosted16 = pick(f"{INFERD}: trivial hosted", 16, "infer_per_s")
    inline16 = pick(f"{INFERD}: trivial inline", 16, "infer_per_s")
    if hosted16 and inline16:
        shares = [h / i for h, i in zip(hosted16, inline16)]
        out["inferd: trivial hosted / inline throughput at c=16 (target >= 0.9x)"] = (
            f"{_median(shares):.2f}x (rounds {', '.join(f'{s:.2f}' for s in shares)})")
    t_alone = pick(f"{TRITON}: trivial alone", 1, "p50_us")
    i_alone = pick(f"{INFERD}: trivial alone", 1, "p50_us")
    if t_alone and i_alone:
        out["trivial alone p50: inferd / Triton"] = f"{_median(i_alone) / _median(t_alone):.2f}x"
    return out
