"""GPU (one run on a CUDA host, by bench/gpu_check.sh): a ResNet-style TorchScript conv net
(64x64 RGB in, 10 classes out; FP16 and FP32) on cuda:0 with 1 and 2 instances and dynamic
batching up to 64, driven by perf_analyzer (gRPC) at concurrency 1, 16 and 128, against the
same model file called directly in torch at batch 1 and 64 on the same GPU (inputs already on
the device; a second batch-64 figure includes the copies from pinned host memory and back).
The net's width is calibrated first, so one FP16 batch of 64 keeps the GPU busy for ~10 ms:
the model, not the Python request path, should bound what the server serves. A small net
(width 16, 32x32) without dynamic batching leaves the GPU idle between launches: 1 against 2
instances at concurrency 16. Then a CUDA shared memory round trip (inputs and outputs in
device memory, tritonclient's cuda_shared_memory utilities) against the same requests over
plain gRPC, the GPU test subset (pytest -m gpu) and the nv_gpu_* metrics scraped from
/metrics. The server, perf_analyzer and the raw-torch loop share the host's cores."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out"
CLASSES = 10


@dataclass(frozen=True)
class Variant:
    """One model directory of the run."""

    name: str
    half: bool
    instances: int
    batching: bool
    width: int
    image: int

    @property
    def dtype(self) -> str:
        return "TYPE_FP16" if self.half else "TYPE_FP32"


@dataclass
class Plan:
    """What one run measures; ``quick`` shortens the perf_analyzer windows only."""

    image: int = 64
    small_width: int = 16
    small_image: int = 32
    concurrencies: tuple[int, ...] = (1, 16, 128)
    idle_concurrency: int = 16
    window_ms: int = 1000
    trials: int = 5
    target_batch_ms: float = 10.0  # calibration: FP16 batch 64 should take at least this long
    start_width: int = 64
    max_width: int = 320  # ~80 M parameters (320 MB in FP32): larger files would cost the run's time to build
    # seconds for the whole scenario (tests, models, runs); gpu_check.sh --budget sets it
    budget_s: float = field(default_factory=lambda: float(os.environ.get("INFERD_GPU_BUDGET_S", "270")))
    shm_calls: int = 200

    def variants(self, width: int) -> list[Variant]:
        out = [Variant(f"resnet_{'fp16' if half else 'fp32'}_{n}inst", half, n, True, width, self.image)
               for half in (True, False) for n in (1, 2)]
        out += [Variant(f"resnet_small_{n}inst", False, n, False, self.small_width, self.small_image) for n in (1, 2)]
        return out

    def runs(self, width: int) -> list[tuple[str, Variant, int]]:
        """(label, variant, concurrency) of every perf_analyzer run, in order."""
        runs = []
        for v in self.variants(width):
            levels = self.concurrencies if v.batching else (self.idle_concurrency,)
            runs += [(run_label(v), v, c) for c in levels]
        return runs


def run_label(v: Variant) -> str:
    what = "FP16" if v.half else "FP32"
    if not v.batching:
        return f"small net FP32, no batching, {v.instances} instance{'s' if v.instances > 1 else ''}"
    return f"resnet {what}, {v.instances} instance{'s' if v.instances > 1 else ''}"


def plan(quick: bool) -> Plan:
    return Plan(window_ms=800, trials=4) if quick else Plan()


# -- the models ------------------------------------------------------------------------------


def config_text(v: Variant, kind: str = "KIND_GPU") -> str:
    from inferd.examples.build import triton_config

    io = ([("INPUT__0", v.dtype, [3, v.image, v.image])], [("OUTPUT__0", v.dtype, [CLASSES])])
    text = triton_config(v.name, *io, max_batch_size=64, platform="pytorch_libtorch",
                         dynamic_batching="" if v.batching else None, instance_count=0)
    gpus = " gpus: [ 0 ]" if kind == "KIND_GPU" else ""
    return text + f"instance_group [ {{ count: {v.instances} kind: {kind}{gpus} }} ]\n"


def build_repository(root: Path, variants: list[Variant], kind: str = "KIND_GPU") -> dict[str, Path]:
    """Write every variant (instances of ``kind``); variants of one net share one model file
    (hard links). Returns each variant's model.pt."""
    from inferd.examples import torch_models as tm

    files: dict[tuple[int, int, bool], Path] = {}
    out = {}
    for v in variants:
        target = root / v.name / "1" / "model.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        (root / v.name / "config.pbtxt").write_text(config_text(v, kind))
        key = (v.width, v.image, v.half)
        if target.exists():
            target.unlink()
        if key in files:
            os.link(files[key], target)
        else:
            target.write_bytes(tm.resnet(v.width, half=v.half))
            files[key] = target
        out[v.name] = target
    return out


# -- the raw runtime -------------------------------------------------------------------------


def _timed(step: Callable[[], None], seconds: float) -> float:
    """Calls of ``step`` per second over ``seconds`` (after 3 warm-up calls)."""
    for _ in range(3):
        step()
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        calls += 1
    return calls / (time.perf_counter() - t0)


def raw_torch(module: Any, half: bool, batch: int, image: int, seconds: float = 1.0,
              with_copies: bool = False) -> float:
    """Rows per second of ``module`` called directly on cuda:0, each batch waited for."""
    import torch

    dtype = torch.float16 if half else torch.float32
    x = torch.randn(batch, 3, image, image, device="cuda:0").to(dtype)
    host = torch.randn(batch, 3, image, image).to(dtype).pin_memory()

    def step() -> None:
        with torch.inference_mode():
            if with_copies:
                module(host.to("cuda:0", non_blocking=True)).cpu()
            else:
                module(x)
            torch.cuda.synchronize()

    return batch * _timed(step, seconds)


def calibrate(p: Plan, log: Callable[[str], None]) -> tuple[int, list[list[float]]]:
    """The width (a multiple of 16) whose FP16 batch of 64 takes ``p.target_batch_ms``, found from
    the start width by scaling with the square root of the time (convolution cost ~ width^2)."""
    import io

    import torch

    from inferd.examples import torch_models as tm

    width, tried = p.start_width, []
    for _ in range(4):
        # Through a saved file, as the server loads it: a frozen module's weights are constants,
        # which map_location moves and ScriptModule.to() would not.
        module = torch.jit.load(io.BytesIO(tm.resnet(width, half=True)), map_location="cuda:0")
        ms = 1000 * 64 / raw_torch(module, True, 64, p.image, seconds=0.5)
        tried.append([width, round(ms, 2)])
        log(f"  calibration: width {width}: FP16 batch 64 in {ms:.2f} ms")
        if ms >= p.target_batch_ms or width >= p.max_width:
            break
        width = min(p.max_width, max(width + 16, int(width * (p.target_batch_ms / ms) ** 0.5) // 16 * 16))
    return width, tried


# -- what the run reads off the server ---------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def successes(url: str) -> dict[str, int]:
    from bench.bench import server_time_us

    return {name: n for name, (n, _, _) in server_time_us(url).items()}


def scrape_gpu_metrics(metrics_url: str) -> dict[str, dict[str, float]]:
    """{family: {gpu_uuid: value}} of the nv_gpu_* / nv_energy_* samples on /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "gpu_uuid" in s.labels:
                out.setdefault(s.name, {})[s.labels["gpu_uuid"]] = s.value
    return out


def cuda_shm_round_trip(url: str, model: str, half: bool, image: int, calls: int) -> dict[str, Any]:
    """The same requests with inputs and outputs in CUDA shared memory and over plain gRPC:
    whether every output is identical, and each path's p50 latency (a Python client)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    dtype, wire = (np.float16, "FP16") if half else (np.float32, "FP32")
    x = np.random.default_rng(0).standard_normal((1, 3, image, image)).astype(dtype)
    out_bytes = CLASSES * x.itemsize
    client = grpcclient.InferenceServerClient(url)
    client.unregister_cuda_shared_memory()
    region_in = cudashm.create_shared_memory_region("gpu_check_in", x.nbytes, 0)
    region_out = cudashm.create_shared_memory_region("gpu_check_out", out_bytes, 0)
    try:
        cudashm.set_shared_memory_region(region_in, [x])
        client.register_cuda_shared_memory("gpu_check_in", cudashm.get_raw_handle(region_in), 0, x.nbytes)
        client.register_cuda_shared_memory("gpu_check_out", cudashm.get_raw_handle(region_out), 0, out_bytes)
        status = client.get_cuda_shared_memory_status(as_json=True)

        def via_shm() -> np.ndarray:
            inp = grpcclient.InferInput("INPUT__0", list(x.shape), wire)
            inp.set_shared_memory("gpu_check_in", x.nbytes)
            out = grpcclient.InferRequestedOutput("OUTPUT__0")
            out.set_shared_memory("gpu_check_out", out_bytes)
            client.infer(model, [inp], outputs=[out])
            return cudashm.get_contents_as_numpy(region_out, dtype, [1, CLASSES])

        def via_host() -> np.ndarray:
            inp = grpcclient.InferInput("INPUT__0", list(x.shape), wire)
            inp.set_data_from_numpy(x)
            return client.infer(model, [inp]).as_numpy("OUTPUT__0")

        host, shm = via_host(), via_shm()
        timings = {}
        for name, call in (("host", via_host), ("cuda_shm", via_shm)):
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                call()
                samples.append(time.perf_counter() - t0)
            timings[name] = round(float(np.median(samples)) * 1e6, 1)
        identical = bool(np.array_equal(host, shm))
        diff = float(np.max(np.abs(host.astype(np.float64) - shm.astype(np.float64))))
        client.unregister_cuda_shared_memory()
        left = client.get_cuda_shared_memory_status(as_json=True)
    finally:
        cudashm.destroy_shared_memory_region(region_in)
        cudashm.destroy_shared_memory_region(region_out)
        client.close()
    return {"model": model, "identical": identical, "max_abs_diff": diff, "p50_us": timings, "calls": calls,
            "registered": sorted(status.get("regions", {})), "left_after_unregister": sorted(left.get("regions", {}))}


def gpu_test_files() -> list[str]:
    """The test modules that hold ``gpu``-marked tests. Only these are collected: the others import
    what the GPU machine lacks (tritonclient.http's gevent, grpcio-tools) and would fail collection."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text())


def run_gpu_tests(timeout_s: float) -> dict[str, Any]:
    """pytest -m gpu over the modules with GPU tests: its counts, and the end of its output when it failed."""
    junit = OUT / "gpu_tests.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *gpu_test_files(),
            f"--junitxml={junit}"]
    try:
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        code, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        code, text = -1, f"timed out after {timeout_s:.0f} s\n{out}"
    counts = junit_counts(junit) if junit.exists() else {}
    summary = text.strip().splitlines()[-1] if text.strip() else ""
    return {"exit": code, "summary": summary, **counts, "tail": "" if code == 0 else text[-3000:]}


def junit_counts(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}  # type: ignore[union-attr]
    n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return n


# -- the run -----------------------------------------------------------------------------------


def require_cuda() -> None:
    """Refuse, saying why, on a host where torch sees no CUDA device."""
    try:
        import torch

        ok = bool(torch.cuda.is_available())
    except ImportError:
        ok = False
    if not ok:
        raise SystemExit("the gpu scenario needs a CUDA GPU (torch.cuda.is_available() is false here); "
                         "run bench/gpu_check.sh on a GPU host, or --dry-run to check the plan here")


def environment() -> dict[str, str]:
    import torch

    env = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "gpu": torch.cuda.get_device_name(0)}
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        pynvml.nvmlShutdown()
    except Exception:  # the figures stand without the driver's version
        pass
    return env


def start_server(repo: Path) -> tuple[Any, str, str]:
    """inferd serving ``repo``; (process, gRPC host:port, metrics URL)."""
    from bench.bench import Proc

    port_file = OUT / "gpu_ports.json"
    port_file.unlink(missing_ok=True)
    proc = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0",
                 "--port-file", str(port_file), "--allow-client-shm"],  # the CUDA shared memory round trip
                "inferd: ready", "inferd_gpu", timeout=240)
    ports = json.loads(port_file.read_text())
    return proc, f"127.0.0.1:{ports['grpc']}", f"http://127.0.0.1:{ports['metrics']}/metrics"


def measure(p: Plan, runs: list[tuple[str, Variant, int]], url: str, pid: int,
            deadline: float, log: Callable[[str], None]) -> list[dict]:
    from bench.bench import Measure, run_pa

    out = []
    for label, v, c in runs:
        if time.monotonic() > deadline:
            out.append(asdict(Measure(label, c, 1, 0.0, 0.0, 0.0, note="skipped: the run's time budget was spent")))
            continue
        before, cpu0 = successes(url).get(v.name, 0), proc_cpu_s(pid)
        m = run_pa(label, v.name, url, c, window_ms=p.window_ms, trials=p.trials)
        done, cpu = successes(url).get(v.name, 0) - before, proc_cpu_s(pid) - cpu0
        if done:
            m.note = (m.note + "; " if m.note else "") + f"server CPU {1e6 * cpu / done:.0f} us/inference"
        out.append(asdict(m))
        log(f"  {label} c={c}: {m.infer_per_s:,.0f}/s p50 {m.p50_us:,.0f} us {m.note}")
    return out


def run(quick: bool) -> dict:
    require_cuda()
    p = plan(quick)
    t0 = time.monotonic()
    deadline = t0 + p.budget_s

    def log(text: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f} s] {text}", flush=True)

    result: dict[str, Any] = {"measures": [], "ceilings": {}, "environment": environment()}
    log(f"GPU: {result['environment']}")
    result["tests"] = run_gpu_tests(timeout_s=min(120.0, p.budget_s / 3))
    log(f"GPU tests: {result['tests']['summary']}")
    width, tried = calibrate(p, log)
    result["calibration"] = {"width": width, "tried_width_ms": tried, "target_batch_ms": p.target_batch_ms}
    repo = OUT / "repo_gpu"
    shutil.rmtree(repo, ignore_errors=True)
    files = build_repository(repo, p.variants(width))
    result["ceilings"] = ceilings(p, width, files, log)
    server, url, metrics_url = start_server(repo)
    try:
        log("server ready")
        result["measures"] = measure(p, p.runs(width), url, server.proc.pid, deadline, log)
        result["cuda_shm"] = cuda_shm_round_trip(url, "resnet_fp32_1inst", False, p.image, p.shm_calls)
        log(f"CUDA shared memory: {result['cuda_shm']}")
        result["gpu_metrics"] = scrape_gpu_metrics(metrics_url)
        log(f"GPU metrics: {sorted(result['gpu_metrics'])}")
    finally:
        server.stop()
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["notes"] = notes(result)
    return result


def ceilings(p: Plan, width: int, files: dict[str, Path], log: Callable[[str], None]) -> dict[str, float]:
    import torch

    out: dict[str, float] = {}
    for half, name in ((True, "resnet_fp16_1inst"), (False, "resnet_fp32_1inst")):
        module = torch.jit.load(str(files[name]), map_location="cuda:0")
        what = "FP16" if half else "FP32"
        for batch in (1, 64):
            out[f"raw torch {what} rows/s, batch {batch}"] = raw_torch(module, half, batch, p.image)
        out[f"raw torch {what} rows/s, batch 64 with host copies"] = raw_torch(module, half, 64, p.image,
                                                                             with_copies=True)
    small = torch.jit.load(str(files["resnet_small_1inst"]), map_location="cuda:0")
    out["raw torch small net FP32 rows/s, batch 1"] = raw_torch(small, False, 1, p.small_image)
    for k, v in out.items():
        log(f"  {k}: {v:,.0f}")
    return out


# -- the report ----------------------------------------------------------------------------------


def _find(result: dict, label: str, c: int) -> dict | None:
    for m in result.get("measures", []):
        if m["label"] == label and m["concurrency"] == c and m["infer_per_s"] > 0:
            return m
    return None


def ratios(result: dict) -> dict[str, str]:
    """The figures the issue asks for: c=128 against raw batch 64, 2 instances against 1,
    CUDA shared memory against the host path, the GPU tests."""
    out: dict[str, str] = {}
    ceilings = result.get("ceilings", {})
    for what in ("FP16", "FP32"):
        raw = ceilings.get(f"raw torch {what} rows/s, batch 64")
        for n in (1, 2):
            m = _find(result, f"resnet {what}, {n} instance{'s' if n > 1 else ''}", 128)
            if m and raw:
                out[f"{what} {n} inst. c=128 / raw torch batch 64"] = f"{m['infer_per_s'] / raw:.2f}x (target >= 0.8)"
        for c in (16, 128):
            one, two = (_find(result, f"resnet {what}, 1 instance", c), _find(result, f"resnet {what}, 2 instances", c))
            if one and two:
                out[f"{what} c={c}: 2 instances / 1"] = f"{two['infer_per_s'] / one['infer_per_s']:.2f}x"
    plan_ = Plan()
    one = _find(result, "small net FP32, no batching, 1 instance", plan_.idle_concurrency)
    two = _find(result, "small net FP32, no batching, 2 instances", plan_.idle_concurrency)
    if one and two:
        out[f"small net c={plan_.idle_concurrency}: 2 instances / 1 (GPU idle between launches)"] = (
            f"{two['infer_per_s'] / one['infer_per_s']:.2f}x (target >= 1.3)")
    shm = result.get("cuda_shm")
    if shm:
        t = shm.get("p50_us", {})
        out["CUDA shared memory results identical to the host path"] = (
            f"{'yes' if shm.get('identical') else 'NO'} (p50 {t.get('cuda_shm', 0):,.0f} us vs host "
            f"{t.get('host', 0):,.0f} us, {shm.get('calls')} calls each, Python client)")
    tests = result.get("tests")
    if tests:
        if tests.get("exit") == 0 and tests.get("passed", 0) > 0:
            verdict = "green"
        elif tests.get("exit") == 0:
            verdict = "NOT RUN (every test skipped)"
        else:
            verdict = "FAILED"
        out["GPU test subset (pytest -m gpu)"] = f"{verdict}: {tests.get('summary', '')}"
    return out


def notes(result: dict) -> str:
    env = result.get("environment", {})
    cal = result.get("calibration", {})
    metrics = result.get("gpu_metrics", {})
    lines = [f"GPU: {env.get('gpu', '?')}, driver {env.get('driver', '?')}, torch {env.get('torch', '?')} "
             f"(CUDA {env.get('cuda', '?')}); run took {result.get('elapsed_s', '?')} s.",
             f"Calibrated width {cal.get('width', '?')} (tried width, FP16 batch-64 ms: {cal.get('tried_width_ms')})."]
    if metrics:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(metrics.items()))
        lines.append(f"GPU metrics scraped after the load: {shown}.")
    else:
        lines.append("GPU metrics: none on /metrics.")
    tests = result.get("tests", {})
    if tests.get("tail"):
        lines.append("GPU test output (end):\n\n```\n" + tests["tail"][-1500:] + "\n```")
    return "\n\n".join(lines)


# -- dry run (any host) ----------------------------------------------------------------------------


def check(repo: Path) -> dict[str, str]:
    """``inferd check`` of a repository: {model: its line}."""
    r = subprocess.run([sys.executable, "-m", "inferd.cli", "check", str(repo)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if ": " in line]
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines}


def dry_run(out: Path) -> dict[str, Any]:
    """What a GPU run would do, checked on any host: the models built at the start width load
    (as KIND_CPU twins), the KIND_GPU configs are refused here only for want of a GPU, and the
    perf_analyzer runs are listed."""
    p = Plan()
    variants = p.variants(16)  # the GPU run calibrates the width; any width checks the configs
    shutil.rmtree(out, ignore_errors=True)
    build_repository(out / "cpu", variants, kind="KIND_CPU")
    build_repository(out / "gpu", variants)
    return {"models": [v.name for v in variants], "cpu_twins": check(out / "cpu"), "gpu_configs": check(out / "gpu"),
            "runs": [[label, v.name, c] for label, v, c in p.runs(16)], "budget_s": p.budget_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="plan and build the models here (no GPU needed)")
    parser.add_argument("--out", type=Path, default=OUT / "repo_gpu_dry", help="where --dry-run builds the models")
    args = parser.parse_args(argv)
    if not args.dry_run:
        parser.error("run the scenario with `python -m bench --scenario gpu`; here only --dry-run")
    print(json.dumps(dry_run(args.out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
